"""Checks before the study's training jobs: the site (site, its rules in site_rules), the system under
test (system, with the readers machine and nvidia), the smoke tests (smoke) and the collective
benchmark (collectives), sharing one runner/record/table helper (common). docs/reference/methods.md,
"Pre-flight checks"."""
