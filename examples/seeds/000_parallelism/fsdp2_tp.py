# Seed 000, "FSDP2 + TP": ColwiseParallel over TP, then fully_shard over FSDP,
# each rank printing its shard; rank 0 prints the weights put together again
# with full_tensor() (the seed saw them out of order: pytorch#129229).
#   torchrun --node_rank=0 --nproc_per_node=4 --nnodes=1 --standalone fsdp2_tp.py
# Lines marked "# added:" or "# changed:" are not in the seed.
import torch
import os
from torch import distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel

import warnings # ignore all warning messages
warnings.filterwarnings("ignore")

class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(12, 12, bias=False)  # changed: "size 12 x 12", as the seed says
        self.relu = nn.ReLU()

        with torch.no_grad():
            self.net1.weight = nn.Parameter(torch.arange(101., 245.))  # changed: 144 values for 12 x 12

    def forward(self, x):
        return self.relu(self.net1(x))

device = 'cuda' if torch.cuda.is_available() else 'cpu'
backend = 'nccl' if device == 'cuda' else 'gloo'

world_size = int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])

dist.init_process_group(backend=backend, world_size=world_size)
if device == 'cuda':
    torch.cuda.set_device(local_rank)

model = ToyModel()

# TP + FSDP: Mesh Shape (2, 4)
mesh = init_device_mesh(device, (2, 2), mesh_dim_names = ['FSDP', 'TP'])  # changed: (2, 4) in the seed; 4 ranks here

# Apply TP
model = parallelize_module(
    model,
    mesh['TP'],
    {
        "net1": ColwiseParallel(),
    }
)

# Apply FSDP2
model = fully_shard(model, mesh=mesh['FSDP'], reshard_after_forward=True)

print(f'Global rank: {dist.get_rank()}, fsdp_rank: {mesh["FSDP"].get_local_rank()}, tp_rank:{mesh["TP"].get_local_rank()}, Weights array: {list(model.parameters())}')

# Check the full unsharded weights
full_tensor = [param.full_tensor() for param in model.parameters()]
if dist.get_rank() == 0:
    print(full_tensor)
