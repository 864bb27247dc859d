"""`python -m scalestudy.train`: see scalestudy.train.trainer."""

from scalestudy.train.trainer import run_as_program

if __name__ == "__main__":
    run_as_program()
