"""Checks before the study's training jobs: the site (site), the system under test (system), the
smoke tests (smoke) and the collective benchmark (collectives)."""
