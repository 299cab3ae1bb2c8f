# Seed 003 ("2D Parallelism using Ray PyTorch") on CPUs: the seed's func()
# and Linear as 2d_parallelism.py has them, with the seed's CPU path
# (TorchTrainer with use_gpu=False: gloo, tensors on the CPU). Each line
# changed for it ends in "# cpu". Under meshrun on a Ray cluster (README, "Ray"):
#   meshrun --ray --nnodes=2 --nproc-per-node=2 2d_parallelism_cpu.py
# and under torchrun with the same layout, for comparison:
#   torchrun --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d ... 2d_parallelism_cpu.py
import torch
import torch.nn as nn
import torch.distributed as dist
import os


class Linear(nn.Module):
    def __init__(self, in_features, out_features, group, ranks):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.rank = int(os.environ['RANK'])
        self.local_rank = int(os.environ['LOCAL_RANK'])
        self.group = group
        self.ranks = ranks
        self.group_rank = dist.get_group_rank(self.group, self.rank)
        self.world_size = group.size()
        self.device = 'cpu'  # cpu
        self.local_in_features = in_features
        self.local_out_features = out_features // self.world_size
        self.linear = nn.Linear(self.local_in_features, self.local_out_features)

    def forward(self, x, batch_size, broadcast = True):
        if broadcast:
            if self.group_rank == 0:
                dist.broadcast(x, src=self.ranks[0], group=self.group)
            else:
                x = torch.zeros(batch_size, self.local_in_features, device=self.device)
                dist.broadcast(x, src=self.ranks[0], group=self.group)
        local_output = self.linear(x)
        gathered_out = [torch.zeros_like(local_output) for _ in range(self.world_size)]
        dist.all_gather(gathered_out, local_output, group = self.group)
        gathered_out = torch.cat(gathered_out, dim=-1)
        print(self.rank, gathered_out.shape)
        return gathered_out


def func():
    rank = int(os.environ['RANK'])
    tp_group1 = dist.new_group([0, 1])
    tp_group2 = dist.new_group([2, 3])
    pp_group = dist.new_group([0, 2])
    batch_size = 32
    input_shape = 50
    output_shape = 4
    if rank in [0, 1]:
        linear1 = Linear(input_shape, input_shape, tp_group1, [0, 1])
        linear1 = linear1.to(linear1.device)
        linear2 = Linear(input_shape, input_shape, tp_group1, [0, 1])
        linear2 = linear2.to(linear2.device)
        linear3 = None
        linear4 = None
    else:
        linear1 = None
        linear2 = None
        linear3 = Linear(input_shape, input_shape, tp_group2, [2, 3])
        linear3 = linear3.to(linear3.device)
        linear4 = Linear(input_shape, output_shape, tp_group2, [2, 3])
        linear4 = linear4.to(linear4.device)
    if rank in [0, 1]:
        if rank == 0:
            input_tensor = torch.randn(batch_size, input_shape, device=linear1.device)
        else:
            input_tensor = None
        out1 = linear1(input_tensor, batch_size, broadcast = True)
        out2 = linear2(out1, batch_size, broadcast = False)
        if rank == 0:
            dist.broadcast(out2, src=0, group = pp_group)
    else:
        if rank == 2:
            out2 = torch.zeros(batch_size, input_shape, device=linear3.device)
            dist.broadcast(out2, src=0, group = pp_group)
        else:
            out2 = None
        out3 = linear3(out2, batch_size, broadcast = True)
        out4 = linear4(out3, batch_size, broadcast = False)
        print(out4.shape)


if __name__ == "__main__":  # added: what Ray's TorchTrainer did for func
    dist.init_process_group('gloo')  # cpu
    func()  # added
    dist.destroy_process_group()  # added
