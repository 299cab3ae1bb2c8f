"""Raises inside torch's @record so TORCHELASTIC_ERROR_FILE gets the traceback."""

import os

from torch.distributed.elastic.multiprocessing.errors import record


def inner_function_that_fails():
    raise ValueError("deliberate failure in rank " + os.environ["RANK"])


@record
def main():
    if os.environ["RANK"] == "1":
        inner_function_that_fails()


if __name__ == "__main__":
    main()
