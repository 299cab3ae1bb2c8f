"""Unit tests of meshrun.ft's pure parts: the identity from the environment,
the sampler's batches (against torch's DistributedSampler), a heal's payload
and the gradient buffers."""

import datetime
import io
import os
import unittest
from unittest import mock

import torch
import torch.distributed as dist
from meshrun import _state, ft
from meshrun._identity import IdentityError, identity_from_env
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.utils.data import TensorDataset
from torch.utils.data.distributed import DistributedSampler as TorchSampler

ENV = {
    "MESHRUN_STORE_ENDPOINT": "127.0.0.1:1",
    "MESHRUN_RESTART_SCOPE": "replica",
    "MESHRUN_REPLICA_SIZE": "2",
    "MESHRUN_REPLICA_ID": "1",
    "MESHRUN_REPLICA_RESTARTS": "3",
    "MESHRUN_ADMISSION_EPOCH": "7",
    "RANK": "3",
    "WORLD_SIZE": "6",
    "LOCAL_WORLD_SIZE": "2",
    "TORCHELASTIC_RUN_ID": "run",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


class IdentityTest(unittest.TestCase):
    def test_reads_meshruns_replica_environment(self) -> None:
        i = identity_from_env(ENV)
        self.assertEqual((i.replica, i.member, i.replica_size, i.replicas_in_world), (1, 1, 2, 3))
        self.assertEqual((i.incarnation, i.admission), (3, 7))
        self.assertEqual(i.store_prefix, "ft/replica1/admission7/incarnation3/")
        self.assertEqual(i.replicas_at_full_strength, 3)  # no MESHRUN_NUM_REPLICAS

    def test_full_strength_is_the_launchers_while_nodes_are_missing(self) -> None:
        # --nnodes=1:4 with one node of 2 workers, groups of 2: 1 of 4 groups.
        env = {**ENV, "WORLD_SIZE": "2", "RANK": "1", "MESHRUN_REPLICA_ID": "0"}
        i = identity_from_env({**env, "MESHRUN_NUM_REPLICAS": "4"})
        self.assertEqual((i.replicas_in_world, i.replicas_at_full_strength), (1, 4))
        self.assertIn("fewer than the 3", self.refused(MESHRUN_NUM_REPLICAS="2"))

    def refused(self, **changes: str | None) -> str:
        env = {k: v for k, v in {**ENV, **changes}.items() if v is not None}
        with self.assertRaises(IdentityError) as caught:
            identity_from_env(env)
        self.assertNotIn("\n", str(caught.exception))
        return str(caught.exception)

    def test_a_refusal_ends_the_program_with_its_line_and_code_2(self) -> None:
        env = {k: v for k, v in ENV.items() if k != "MESHRUN_RESTART_SCOPE"}
        stderr = io.StringIO()
        with (
            mock.patch.dict(os.environ, env, clear=True),
            mock.patch("sys.stderr", stderr),
            self.assertRaises(ft.UsageError) as caught,
        ):
            ft.replica_id()
        self.assertEqual(caught.exception.code, 2)
        self.assertEqual(stderr.getvalue(), str(caught.exception) + "\n")
        self.assertTrue(str(caught.exception).startswith("meshrun.ft: meshrun runs this job"))

    def test_refuses_the_job_scope_naming_the_flag(self) -> None:
        self.assertIn("--restart-scope=replica", self.refused(MESHRUN_RESTART_SCOPE=None))

    def test_refuses_a_program_not_started_by_meshrun(self) -> None:
        self.assertIn("start this program with meshrun", self.refused(MESHRUN_STORE_ENDPOINT=None))

    def test_refuses_a_group_spanning_nodes(self) -> None:
        message = self.refused(MESHRUN_REPLICA_SIZE="3", LOCAL_WORLD_SIZE="2", RANK="3")
        self.assertIn("would span nodes", message)

    def test_refuses_a_replica_id_the_rank_contradicts(self) -> None:
        self.assertIn("MESHRUN_REPLICA_ID=2", self.refused(MESHRUN_REPLICA_ID="2"))

    def test_refuses_a_garbled_number(self) -> None:
        self.assertIn("not an integer", self.refused(MESHRUN_REPLICA_RESTARTS="x"))


class SamplerTest(unittest.TestCase):
    """Step s of epoch e serves torch's DistributedSampler's batch s of epoch e
    for the worker's global rank at full strength."""

    def test_each_steps_batch_is_torchs(self) -> None:
        dataset = TensorDataset(torch.arange(45))
        batch = 4
        fake = mock.Mock(current_step=mock.Mock(return_value=0), step_in_progress=False)
        for rank in range(6):
            env = {**ENV, "RANK": str(rank), "MESHRUN_REPLICA_ID": str(rank // 2)}
            with mock.patch.dict(os.environ, env, clear=True):
                ours = ft.DistributedSampler(dataset, batch, seed=5)
            theirs = TorchSampler(dataset, num_replicas=6, rank=rank, seed=5)
            self.assertEqual(len(ours), len(theirs))
            for epoch in range(3):
                theirs.set_epoch(epoch)
                expected = list(theirs)
                for k in range(ours.steps_per_epoch):
                    step = epoch * ours.steps_per_epoch + k
                    fake.start_step.return_value = step
                    fake.current_step.return_value = step
                    ours.set_epoch(epoch)
                    with mock.patch.object(ft, "_manager", fake):
                        got = next(iter_batch(ours, batch))
                    self.assertEqual(got, expected[k * batch : (k + 1) * batch])

    def test_a_step_past_the_loops_epoch_ends_the_epoch(self) -> None:
        dataset = TensorDataset(torch.arange(48))
        with mock.patch.dict(os.environ, ENV, clear=True):
            sampler = ft.DistributedSampler(dataset, 4)  # 8 per shard: 2 steps an epoch
        healed = mock.Mock(
            start_step=mock.Mock(return_value=5),
            current_step=mock.Mock(return_value=5),
            step_in_progress=True,
        )
        with mock.patch.object(ft, "_manager", healed):
            self.assertEqual(list(sampler), [])  # epoch 0: nothing left
            self.assertEqual(sampler.start_epoch, 2)

    def test_an_elastic_jobs_shards_are_those_of_full_strength(self) -> None:
        # One node of two (groups of 2) serves shards 0 and 1 of 4, as it
        # will once the second node's groups take shards 2 and 3.
        dataset = TensorDataset(torch.arange(40))
        env = {**ENV, "WORLD_SIZE": "2", "RANK": "1", "MESHRUN_REPLICA_ID": "0"}
        with mock.patch.dict(os.environ, {**env, "MESHRUN_NUM_REPLICAS": "2"}, clear=True):
            ours = ft.DistributedSampler(dataset, 2, shuffle=False)
        fake = mock.Mock(
            start_step=mock.Mock(return_value=0), current_step=mock.Mock(return_value=0)
        )
        with mock.patch.object(ft, "_manager", fake):
            self.assertEqual(next(iter_batch(ours, 2)), [1, 5])
        self.assertEqual(len(ours), 10)


def iter_batch(sampler: ft.DistributedSampler, batch: int):
    it = iter(sampler)
    yield [next(it) for _ in range(batch)]


class StateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        dist.init_process_group(
            "gloo", store=dist.HashStore(), rank=0, world_size=1,
            timeout=datetime.timedelta(seconds=30),
        )  # fmt: skip

    @classmethod
    def tearDownClass(cls) -> None:
        dist.destroy_process_group()

    def test_nested_state_round_trips(self) -> None:
        state = {"model": {"w": torch.randn(3, 2)}, "optimizer": {"state": {0: {"step": 4}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}, "note": ("a", 1)}  # fmt: skip
        back = _state.unpack(_state.pack(state), None)
        self.assertTrue(torch.equal(back["model"]["w"], state["model"]["w"]))
        self.assertEqual(back["optimizer"], state["optimizer"])
        self.assertEqual(back["note"], ("a", 1))

    def test_a_dtensor_travels_as_its_shard_and_is_rewrapped_on_the_receivers_mesh(self) -> None:
        mesh = init_device_mesh("cpu", (1,))
        tensor = distribute_tensor(torch.arange(8.0).view(4, 2), mesh, [Shard(0)])
        back = _state.unpack(_state.pack({"w": tensor}), {"w": tensor})
        self.assertEqual(back["w"].placements, (Shard(0),))
        self.assertTrue(torch.equal(back["w"].full_tensor(), tensor.full_tensor()))


class GradientBufferTest(unittest.TestCase):
    def test_one_buffer_per_dtype_and_back(self) -> None:
        tensors = [torch.ones(2, 2), torch.zeros(3, dtype=torch.float64), torch.full((1,), 2.0)]
        flats = ft._flatten_by_dtype(tensors)
        self.assertEqual(sorted(f.numel() for f in flats.values()), [3, 5])
        for flat in flats.values():
            flat.add_(1)
        ft._unflatten(flats, tensors)
        self.assertTrue(torch.equal(tensors[0], torch.full((2, 2), 2.0)))
        self.assertTrue(torch.equal(tensors[1], torch.ones(3, dtype=torch.float64)))
        self.assertTrue(torch.equal(tensors[2], torch.full((1,), 3.0)))


if __name__ == "__main__":
    unittest.main()
