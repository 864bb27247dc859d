"""The study as a Workflow Run RO-Crate (Provenance Run Crate profile): written, checked, validated."""
