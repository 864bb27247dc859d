"""`python -m scalestudy.workloads.command`: see scalestudy.workloads.command.runner."""

from scalestudy.workloads.command.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
