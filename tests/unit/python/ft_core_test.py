"""Unit tests of meshrun.ft's pure parts: the identity from the environment,
the sampler's batches (against torch's DistributedSampler), a heal's payload
and its transfer over an in-process Gloo group, the backend picked by
device, and the gradient buffers."""

import concurrent.futures
import datetime
import io
import os
import socket
import tempfile
import threading
import time
import unittest
import uuid
from unittest import mock

import torch
import torch.distributed as dist
from meshrun import _state, ft
from meshrun._daemon import Quorum, _channel, channel_target
from meshrun._identity import IdentityError, identity_from_env
from meshrun._replica_group import ReplicaDimension, nccl_group
from torch._C._distributed_c10d import ErrorType
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


class ChannelTargetTest(unittest.TestCase):
    """MESHRUN_STORE_ENDPOINT as a list of daemon replicas (meshrun
    --rdzv-endpoint=A,B): one channel over every address, in order."""

    def test_one_endpoint_is_the_target_as_it_is(self) -> None:
        self.assertEqual(channel_target("node0:29400"), ("node0:29400", ""))

    def test_a_list_names_every_address_in_order(self) -> None:
        self.assertEqual(
            channel_target("127.0.0.2:5, 127.0.0.1:6"),
            ("ipv4:127.0.0.2:5,127.0.0.1:6", "127.0.0.2"),
        )
        self.assertEqual(
            channel_target("[::1]:5,127.0.0.1:6"), ("ipv6:[::1]:5,[::ffff:127.0.0.1]:6", "::1")
        )

    def test_the_channel_skips_a_replica_that_refuses(self) -> None:
        import grpc

        server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        # A port nothing listens on (bound, so no one else takes it meanwhile).
        with socket.socket() as standby:
            standby.bind(("127.0.0.1", 0))
            refused = standby.getsockname()[1]
            channel = _channel(f"127.0.0.1:{refused},127.0.0.1:{port}", {})
            try:
                grpc.channel_ready_future(channel).result(timeout=20)
            finally:
                channel.close()
                server.stop(None)


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

    def round_trip(self, state, own=None):
        skeleton, tensors = _state.split(state)
        back, metas = _state.load_skeleton(skeleton)
        self.assertEqual([(m.shape, m.dtype) for m in metas],
                         [(t.shape, t.dtype) for t in tensors])  # fmt: skip
        return _state.join(back, [t.clone() for t in tensors], own)

    def test_nested_state_round_trips(self) -> None:
        state = {"model": {"w": torch.randn(3, 2)}, "optimizer": {"state": {0: {"step": 4}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}, "note": ("a", 1)}  # fmt: skip
        back = self.round_trip(state)
        self.assertTrue(torch.equal(back["model"]["w"], state["model"]["w"]))
        self.assertEqual(back["optimizer"], state["optimizer"])
        self.assertEqual(back["note"], ("a", 1))

    def test_the_skeleton_holds_no_tensor_data(self) -> None:
        skeleton, tensors = _state.split({"w": torch.zeros(1 << 20)})  # 4 MiB
        self.assertLess(len(skeleton), 4096)
        self.assertEqual(tensors[0].numel(), 1 << 20)

    def test_a_dtensor_travels_as_its_shard_and_is_rewrapped_on_the_receivers_mesh(self) -> None:
        mesh = init_device_mesh("cpu", (1,))
        tensor = distribute_tensor(torch.arange(8.0).view(4, 2), mesh, [Shard(0)])
        back = self.round_trip({"w": tensor}, {"w": tensor})
        self.assertEqual(back["w"].placements, (Shard(0),))
        self.assertTrue(torch.equal(back["w"].full_tensor(), tensor.full_tensor()))

    def test_a_skeleton_that_would_run_code_is_refused_not_run(self) -> None:
        with tempfile.TemporaryDirectory() as directory:
            marker = os.path.join(directory, "ran")
            with self.assertRaises(_state.RefusedState) as caught:
                _state.load_skeleton(evil_skeleton(marker))
            self.assertFalse(os.path.exists(marker))
        self.assertNotIn("\n", str(caught.exception))
        self.assertIn("weights_only", str(caught.exception))


class _RunsCode:
    """Unpickled by a full unpickler, it runs a command (touches a file)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_skeleton(marker: str) -> bytes:
    buffer = io.BytesIO()
    torch.save({"tree": {"step": 1, "x": _RunsCode(marker)}, "dtensors": {}, "cpu": []}, buffer)
    return buffer.getvalue()


class BackendTest(unittest.TestCase):
    """Issue 44 item 1: no backend picks by device, as torch does."""

    def test_no_backend_is_gloo_on_cpu_and_both_with_cuda(self) -> None:
        self.assertEqual(ft._default_group_backend(None, cuda=False), "gloo")
        self.assertEqual(ft._default_group_backend(None, cuda=True), "cpu:gloo,cuda:nccl")
        self.assertEqual(ft._replica_backend(None, "cpu:gloo", cuda=False), "gloo")
        self.assertEqual(ft._replica_backend(None, "cpu:gloo,cuda:nccl", cuda=True), "nccl")
        self.assertEqual(ft._replica_backend(None, "cpu:gloo", cuda=True), "gloo")
        self.assertEqual(ft._replica_backend(None, None, cuda=False), "gloo")
        # A gloo replica dimension beside an NCCL group is allowed (CPU peers).
        self.assertEqual(ft._replica_backend("gloo", "cuda:nccl", cuda=True), "gloo")

    def refused(self, fn, *args) -> str:
        stderr = io.StringIO()
        with mock.patch("sys.stderr", stderr), self.assertRaises(ft.UsageError) as caught:
            fn(*args, cuda=False)
        self.assertEqual(caught.exception.code, 2)
        self.assertEqual(stderr.getvalue().count("\n"), 1)
        return str(caught.exception)

    def test_a_mismatch_is_refused_in_one_line(self) -> None:
        self.assertIn("needs CUDA", self.refused(ft._default_group_backend, "nccl"))
        self.assertIn("needs CUDA", self.refused(ft._replica_backend, "nccl", None))
        self.assertIn("gloo or nccl", self.refused(ft._replica_backend, "mpi", "cpu:gloo"))
        with mock.patch("sys.stderr", io.StringIO()), self.assertRaises(ft.UsageError) as caught:
            ft._replica_backend("nccl", "cpu:gloo", cuda=True)
        self.assertIn("disagrees with the default group's 'cpu:gloo'", str(caught.exception))


class HealTest(unittest.TestCase):
    """A heal over a real Gloo group of three participants (threads): the
    source sends to the one behind, the one in step does nothing past one
    all-gather, and a skeleton that would run code is refused."""

    def participants(self, n: int) -> list[ReplicaDimension]:
        store = dist.PrefixStore(str(uuid.uuid4()), STORE)
        timeout = datetime.timedelta(seconds=20)
        groups: list = [None] * n

        def make(r: int) -> None:
            groups[r] = dist.ProcessGroupGloo(store, r, n, timeout)

        run_all([lambda r=r: make(r) for r in range(n)])
        dims = []
        for r in range(n):
            identity = mock.Mock(replica=r, member=0, incarnation=1)
            dim = ReplicaDimension(identity, store, "gloo", timeout)
            dim.group, dim.group_id = groups[r], 1
            dims.append(dim)
        return dims

    def manager(self, dim: ReplicaDimension, step: int, state) -> ft.Manager:
        m = object.__new__(ft.Manager)
        m._id, m._replicas, m._step, m._discard_reason = dim._id, dim, step, ""
        m._history = [[0, 1, 2]] * step
        m._state_dict = mock.Mock(return_value=state)
        m._load_state_dict = mock.Mock()
        return m

    def test_only_the_group_behind_receives(self) -> None:
        state = {"model": {"w": torch.randn(40, 3), "h": torch.randn(5).to(torch.bfloat16),
                 "mask": torch.tensor([True, False]), "n": torch.tensor(7), "e": torch.empty(0)},
                 "optimizer": {"param_groups": [{"lr": 0.1}], "t": (1, "a")}}  # fmt: skip
        dims = self.participants(3)
        source, bystander, receiver = (
            self.manager(dims[0], 7, state),
            self.manager(dims[1], 7, {"model": {}}),
            self.manager(dims[2], 3, {"model": {}}),
        )
        quorum = Quorum(1, [0, 1, 2], 7, 0, True, 1)
        for spied in ("recv", "send", "broadcast"):
            setattr(dims[1], spied, mock.Mock(side_effect=AssertionError(spied)))
        with mock.patch.object(ft, "CHUNK_BYTES", 64), mock.patch("sys.stderr", io.StringIO()):
            run_all([lambda m=m: m._heal(quorum, 0) for m in (source, bystander, receiver)])
        for m in (source, bystander, receiver):
            self.assertEqual(m._discard_reason, "")
        bystander._state_dict.assert_not_called()
        bystander._load_state_dict.assert_not_called()
        (got,), _ = receiver._load_state_dict.call_args
        for key, tensor in state["model"].items():
            self.assertEqual(got["model"][key].dtype, tensor.dtype)
            self.assertTrue(torch.equal(got["model"][key], tensor), key)
        self.assertEqual(got["optimizer"], state["optimizer"])
        self.assertEqual((receiver._step, receiver._history), (7, [[0, 1, 2]] * 7))

    def test_a_heal_that_would_run_code_is_refused_with_one_line(self) -> None:
        dims = self.participants(2)
        receiver = self.manager(dims[1], 0, {})
        with tempfile.TemporaryDirectory() as directory:
            marker = os.path.join(directory, "ran")
            payload = evil_skeleton(marker)

            def evil_source() -> None:
                dims[0].send(torch.tensor([len(payload)], dtype=torch.int64), [1], 0)
                dims[0].send(torch.frombuffer(bytearray(payload), dtype=torch.uint8), [1], 1)

            stderr = io.StringIO()
            with mock.patch("sys.stderr", stderr):
                errors = run_all(
                    [
                        evil_source,
                        lambda: receiver._receive_state(Quorum(1, [0, 1], 5, 0, True, 1), 0),
                    ],
                    raises=False,
                )
            self.assertFalse(os.path.exists(marker))
        self.assertIsInstance(errors[1], ft.HealRefused)
        self.assertEqual(errors[1].code, 1)
        lines = stderr.getvalue().splitlines()
        self.assertEqual(len(lines), 1, lines)
        self.assertTrue(lines[0].startswith("meshrun.ft: the heal from replica 0 is refused: "))
        receiver._load_state_dict.assert_not_called()


class NcclPathTest(unittest.TestCase):
    """Issue 44 item 2, the parts a CPU can check (the rest is
    tests/device/ft_nccl_check.py under scripts/device-check.sh): the
    replica dimension's NCCL groups fail their works, never the process."""

    def dimension(self, group) -> ReplicaDimension:
        dim = ReplicaDimension(mock.Mock(member=0), dist.HashStore(), "gloo",
                               datetime.timedelta(seconds=0.3))  # fmt: skip
        dim._backend, dim.group, dim.group_id = "nccl", group, 1
        return dim

    def test_the_group_is_built_to_clean_up_not_tear_down(self) -> None:
        seen = {}

        def construct(store, rank, size, options):
            seen["handling"] = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
            seen["blocking"] = options.config.blocking
            return mock.Mock()

        env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}  # the agent's, torchrun's
        with (
            mock.patch.dict(os.environ, env),
            mock.patch.object(dist, "ProcessGroupNCCL", mock.Mock(side_effect=construct,
                                                                  Options=dist.ProcessGroupNCCL.Options)),
        ):  # fmt: skip
            group = nccl_group(dist.HashStore(), 0, 2, datetime.timedelta(seconds=5), "cuda:0")
            self.assertEqual(os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1")
        self.assertEqual(seen, {"handling": "2", "blocking": 0})
        group.eager_connect_single_device.assert_called_once_with("cuda:0")
        group.abort.assert_not_called()

    def test_a_group_whose_peer_never_comes_is_aborted_within_the_timeout(self) -> None:
        aborted = threading.Event()
        group = mock.Mock(abort=mock.Mock(side_effect=aborted.set))
        # The communicator's init waits for the missing peer until aborted.
        group.eager_connect_single_device.side_effect = lambda device: aborted.wait(10)
        nccl = mock.Mock(return_value=group, Options=dist.ProcessGroupNCCL.Options)
        start = time.monotonic()
        with mock.patch.object(dist, "ProcessGroupNCCL", nccl), self.assertRaises(TimeoutError):
            nccl_group(dist.HashStore(), 0, 2, datetime.timedelta(seconds=0.3), "cuda:0")
        self.assertLess(time.monotonic() - start, 5)
        self.assertGreaterEqual(group.abort.call_count, 1)

    def test_a_wait_past_the_timeout_aborts_the_group_and_raises(self) -> None:
        aborted = threading.Event()

        def wait(timeout=None):
            if not aborted.wait(10):  # NCCL's kernel, its peer gone: until aborted
                raise AssertionError("never aborted")
            raise RuntimeError("NCCL communicator was aborted")

        group = mock.Mock(abort=mock.Mock(side_effect=aborted.set))
        group.allreduce.return_value = mock.Mock(wait=wait)
        dim = self.dimension(group)
        start = time.monotonic()
        with self.assertRaises(TimeoutError):
            dim.allreduce(torch.ones(2))
        self.assertLess(time.monotonic() - start, 5)
        group.abort.assert_called_once()

    def test_an_error_the_watchdog_recorded_fails_the_work(self) -> None:
        group = mock.Mock()
        group.allreduce.return_value = mock.Mock(wait=mock.Mock(return_value=True))
        group.get_error.return_value = ErrorType.REMOTE_ERROR
        with self.assertRaises(RuntimeError) as caught:
            self.dimension(group).allreduce(torch.ones(2))
        self.assertIn("REMOTE_ERROR", str(caught.exception))
        group.allreduce.return_value.wait.assert_called_once_with(datetime.timedelta(seconds=0.3))

    def test_a_replaced_or_failed_group_is_aborted(self) -> None:
        for leave in ("drop", "fail"):
            group = mock.Mock()
            dim = self.dimension(group)
            getattr(dim, leave)()
            group.abort.assert_called_once()
            self.assertIsNone(dim.group)


STORE = dist.HashStore()


def run_all(fns, raises: bool = True) -> list[BaseException | None]:
    """Runs each of `fns` in its own thread; their exceptions, by index."""
    errors: list[BaseException | None] = [None] * len(fns)

    def call(i: int) -> None:
        try:
            fns[i]()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        if t.is_alive():
            raise AssertionError("a participant hung")
    if raises:
        for e in errors:
            if e is not None:
                raise e
    return errors


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
