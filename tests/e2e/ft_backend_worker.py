"""A meshrun.ft program for ft_python_test.py's backend case (issue 44 item
1): ft.init_process_group() with no backend (or the BACKEND given), then
STEPS steps; each worker says how many committed."""

import sys

import torch
from meshrun import ft

BACKEND = None if sys.argv[1] == "default" else sys.argv[1]
STEPS = int(sys.argv[2])

ft.init_process_group(BACKEND)
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
plain = torch.optim.SGD(model.parameters(), lr=0.01)
manager = ft.Manager.from_module(model, plain)
optimizer = ft.Optimizer(manager, plain)
committed = 0
for _ in range(STEPS):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).square().mean().backward()
    committed += optimizer.step()
print(f"replica {ft.replica_id()} committed {committed} of {STEPS}", flush=True)
ft.destroy_process_group()
