"""Stage 6's DDP check as a command: one packed optimizer step on 2 ranks, its loss normalised
two ways, each gradient against one process's (the recipe and why: mmdp.training.ddp).

    uv run torchrun --standalone --nproc_per_node 2 -m mmdp.check_ddp --metrics-json /tmp/ddp.json
"""

from mmdp.flags import parse_flags
from mmdp.training.ddp import DdpSettings, main

if __name__ == "__main__":
    main(parse_flags(DdpSettings, __doc__, prog="python -m mmdp.check_ddp"))
