# Seed 001: the same 2-D setup in two lines with init_device_mesh. As written
# it needs 8 GPUs ("cuda"):
#   torchrun --nproc_per_node=8 2d_setup_with_device_mesh.py
from torch.distributed.device_mesh import init_device_mesh
mesh_2d = init_device_mesh("cuda", (2, 4), mesh_dim_names=("replicate", "shard"))

# Users can access the underlying process group thru `get_group` API.
replicate_group = mesh_2d.get_group(mesh_dim="replicate")
shard_group = mesh_2d.get_group(mesh_dim="shard")
