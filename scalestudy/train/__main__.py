"""`python -m scalestudy.train`: see scalestudy.train.program."""

from scalestudy.train.program import run_as_program

if __name__ == "__main__":
    run_as_program()
