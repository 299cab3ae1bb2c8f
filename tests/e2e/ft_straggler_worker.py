"""A meshrun.ft program for ft_python_test.py's straggler case: one replica
group per worker; replica group SLOW sleeps before each step, so it reaches
every step's quorum last."""

import sys
import time

import torch
from meshrun import ft

STEPS = int(sys.argv[1])
SLOW = int(sys.argv[2])
DELAY_S = 0.03

ft.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
plain = torch.optim.SGD(model.parameters(), lr=0.01)
optimizer = ft.Optimizer(ft.Manager.from_module(model, plain), plain)
for _ in range(STEPS):
    if ft.replica_id() == SLOW:
        time.sleep(DELAY_S)
    optimizer.zero_grad()
    model(torch.randn(4, 8)).square().mean().backward()
    optimizer.step()
print(f"replica {ft.replica_id()} trained {STEPS} steps", flush=True)
ft.destroy_process_group()
