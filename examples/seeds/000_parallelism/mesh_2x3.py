# Seed 000 ("PyTorch parallelism", 2024-10-11), "Understanding Device Mesh":
# the 2-D mesh (2, 3) with named dimensions, each rank printing its TP mesh.
#   torchrun --node_rank=0 --nproc_per_node=6 --nnodes=1 --standalone mesh_2x3.py
# Lines marked "# added:" are not in the seed (its snippets leave out imports).
import os  # added: the seed uses os and torch without importing them
import torch  # added: as above

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

# Code for helping init process group
device = 'cuda' if torch.cuda.is_available() else 'cpu'
backend = 'nccl' if device == 'cuda' else 'gloo'

rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])

dist.init_process_group(backend=backend, world_size=world_size)
if device == 'cuda':
    torch.cuda.set_device(local_rank)

device_mesh = init_device_mesh(device, (2, 3), mesh_dim_names = ['dp', 'tp'])
tp_mesh = device_mesh['tp']
print(f'Rank: {dist.get_rank()}, {tp_mesh}')
