"""meshrun.ft with a state_dict callback that raises (ft_python_test.py's
`callback` and `finish_callback` cases): two replica groups of one worker
train a Linear; replica 1 SIGKILLs itself at step 20 in its first life; when
it comes back, replica 0, the source of its heal, finds its state_dict
callback raising.

    ft_callback_worker.py heal    # replica 0 trains on until replica 1 is back:
                                  # a heal during training fails
    ft_callback_worker.py finish  # replica 0 stops at step 60: the heal at
                                  # destroy_process_group's last quorum fails
"""

import os
import signal
import sys

import torch
from meshrun import ft

mode = sys.argv[1]
ft.init_process_group("gloo")
replica = ft.replica_id()
lives = int(os.environ["MESHRUN_REPLICA_RESTARTS"])
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def state_dict() -> dict:
    if replica == 0:
        raise ValueError("the program cannot give its state")
    return {"model": model.state_dict()}


def done(step: int) -> bool:
    if mode == "finish":
        return step >= 60
    # Replica 0 trains on until replica 1 is back (its heal is what fails),
    # however long the restart takes. (Without that failure, the two would
    # train together until step 400.)
    return step >= 400 and manager.num_participants() == 2


manager = ft.Manager(state_dict, lambda state: model.load_state_dict(state["model"]))
optimizer = ft.Optimizer(manager, optimizer)
while True:
    optimizer.zero_grad()
    step = manager.current_step()
    if done(step):
        break
    if replica == 1 and lives == 0 and step == 20:
        os.kill(os.getpid(), signal.SIGKILL)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step * 2 + replica))
    model(x).pow(2).mean().backward()
    optimizer.step()
    if replica == 0 and step % 50 == 0:
        print(f"replica 0 trained step {step}", flush=True)
print(f"replica {replica} life {lives} leaves at step {manager.current_step()}", flush=True)
ft.destroy_process_group()
