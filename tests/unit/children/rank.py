# One torchrun rank under `python -m shim` (test_activation.py test_run_reaches_every_torchrun_rank): whether
# the shim is active here and on how many ranks, written to OUT_DIR/rank<N>.json.
import json
import os

import shim

# the order of the inline program it was
# isort: split
import torch.distributed as dist

dist.init_process_group('gloo')
t = __import__('torch').tensor([1 if shim.is_active() else 0])
dist.all_reduce(t)
# one file per rank: two ranks printing to one pipe can interleave their lines
open(os.path.join(os.environ['OUT_DIR'], f'rank{dist.get_rank()}.json'), 'w').write(
    json.dumps({'rank': dist.get_rank(), 'active': shim.is_active(), 'active_ranks': int(t)}))
dist.destroy_process_group()
