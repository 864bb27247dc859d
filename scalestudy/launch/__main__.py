"""`python -m scalestudy.launch`: see scalestudy.launch.launcher."""

from scalestudy.launch.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
