"""Fails inside torch's @record, so TORCHELASTIC_ERROR_FILE holds a traceback."""

import os

from torch.distributed.elastic.multiprocessing.errors import record


def load_batch(step):
    raise ValueError(f"corrupt batch at step {step} on rank {os.environ['RANK']}")


@record
def main():
    load_batch(17)


if __name__ == "__main__":
    main()
