"""The agent's loop: join enrolled jobs, wait for its rounds, run the client step and the
tenant-placed privacy locally, send the privatised upload; serve recommendations locally.

Each round the tenant is selected in goes: download the global message; run the client
half of the round (:func:`algorithms.simulate.client_round`, as a hosted tenant's client
step does: the local step on the same public streams, ``client_rng(seed, round, client)``,
under user-level DP with the users' caps and Poisson samples from the agent's own secret
key, :attr:`agent.state.AgentState.user_draws_key`; then check-privatise-charge on the
agent's *own* ledger through :class:`privacy.release.UploadRelease`, the release the job's
settings decide, noise from a fresh secret generator); persist the charge with the pending upload
(:mod:`agent.state`); send through :attr:`Agent.uploader` (the one function a secure
aggregation wrapper replaces); adopt the new local state once the coordinator accepted it.
A refusal of its own ledger is said on stderr and sent to the coordinator as a decline.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from pydantic import ValidationError

from agent import data as agent_data
from agent import forget as agent_forget
from agent.client import Coordinator, Refused
from agent.secure import SecAggUploader
from agent.state import AgentState, sync_dir
from algorithms import Message, RatingBlock, registry
from algorithms.ingest import Collected, UploadRejected
from algorithms.recommend import top_k
from algorithms.simulate import (
    client_round,
    initialise_client,
    initialise_server,
    tenant_errors,
)
from privacy.randomness import with_user_draws
from privacy.release import Release, UploadRelease, release_of

RUNNING = ("queued", "running")
#: fault injection for the process tests: "die-before-send:K" kills the agent in round K
#: right after its charge and pending upload are on disk, before anything is sent
FAULT = "FEDREC_AGENT_FAULT"


class Uploader(Protocol):
    """Sends round ``round_``'s privatised upload bytes (or ``b""``: nothing to send) with
    the charge the agent recorded; returns the coordinator's answer. Secure aggregation
    replaces this with its key/share/masked-upload exchange."""

    def __call__(self, coordinator: Coordinator, manifest: dict[str, Any], round_: int,
                 data: bytes, charge: list | None) -> dict[str, Any]: ...


def plain_upload(coordinator: Coordinator, manifest: dict[str, Any], round_: int,
                 data: bytes, charge: list | None) -> dict[str, Any]:
    """The upload as it is (no secure aggregation)."""
    return coordinator.upload(manifest["job_id"], round_, data, charge)


def on_wire(msg: Message, wire: str) -> bytes:
    """The message bytes as sent: float64 arrays cast to float32 when the job says so
    (after the noise: post-processing)."""
    if wire == "float32":
        msg = msg.replace(**{k: v.astype(np.float32) for k, v in msg.arrays().items()
                             if v.dtype == np.float64})
    return msg.to_bytes()


def sync_files(folder: Path, names: list[str]) -> None:
    """fsync the files that exist among ``names`` in ``folder``, then the folder."""
    for name in names:
        path = folder / name
        if path.exists():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    sync_dir(folder)


def say(text: str) -> None:
    print(f"fedrec agent: {text}", file=sys.stderr, flush=True)


#: the agent protocols this release speaks (the coordinator's manifest names its own)
PROTOCOLS = (1,)


def _version() -> str:
    try:
        return importlib.metadata.version("fedrec")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "unknown"


class Agent:
    """One tenant's agent over its state directory."""

    def __init__(self, coordinator: Coordinator, state: AgentState,
                 source: Callable[[tuple[float, float]], Collected],
                 uploader: Uploader = plain_upload,
                 log: Callable[[str], None] = say) -> None:
        self.coord, self.state, self.source = coordinator, state, source
        self.uploader, self.log = uploader, log
        self._memo: dict[tuple[int, str], Any] = {}  # parsed copies of state files
        #: the uploader of jobs with secure aggregation (its wait: a long-poll per phase)
        self.secure = SecAggUploader(state)
        self._forgotten: set[str] | None = None  # the tombstones last applied
        self._not_again: set[tuple[int, int]] = set()  # rounds asked for a second time

    # ---- forgetting (agent.forget) ---------------------------------------------------
    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The state directory's lock, with every tombstone applied: a user forgotten
        meanwhile (``fedrec agent forget`` in another process) is out of this step."""
        with agent_forget.locked(self.state.root):
            forgotten = set(agent_forget.load(self.state.root)["users"])
            if forgotten != self._forgotten:
                agent_forget.scrub_all(self.state.root, forgotten)
                self._memo.clear()  # parsed copies of files the scrub may have rewritten
                self._forgotten = forgotten
            yield

    def sync_forgotten(self) -> None:
        """Fetch and apply the users the tenant asked the coordinator to forget."""
        after = int(agent_forget.load(self.state.root)["after"])
        answer = self.coord.forgotten(after)
        if answer["last"] == after:
            return
        with agent_forget.locked(self.state.root):
            new = agent_forget.apply_requests(self.state.root, answer["data"], answer["last"])
            self._forgotten = None  # re-read at the next step
            self._memo.clear()
        for user in new:
            self.log(f"forgot user {user!r} as the coordinator asked")

    # ---- joining a job ---------------------------------------------------------------
    def setup(self, job_id: int) -> None:
        """Fetch the manifest, lay out and split the ratings but those of forgotten users,
        initialise the local state."""
        with self.exclusive():
            self._setup(job_id)

    def _setup(self, job_id: int) -> None:
        manifest = self.coord.manifest(job_id)
        if manifest.get("protocol") not in PROTOCOLS:
            raise ValueError(f"job {job_id}: the coordinator speaks agent protocol "
                             f"{manifest.get('protocol')!r} and this agent (fedrec "
                             f"{_version()}) speaks {', '.join(map(str, PROTOCOLS))}; "
                             f"install the coordinator's fedrec release here")
        dp = manifest["privacy"]
        if release_of(dp) is Release.USER_CENTRAL:
            raise ValueError(f"job {job_id}: placement {dp.get('placement')!r} would need "
                             "this tenant's un-noised sum; agents send noised uploads only")
        try:
            collected = agent_data.checked(self.source(tuple(manifest["tenant_scale"])),
                                           manifest["items"])
            collected = agent_forget.without_users(collected, self._forgotten or set())
        except UploadRejected as exc:
            raise ValueError("the ratings are invalid, as the upload API would answer:\n"
                             + agent_data.describe(exc)) from None
        block, users = agent_data.tenant_block(collected, manifest["items"])
        train, test = agent_data.job_split(block, manifest)
        alg, cfg = self._alg(manifest)
        _, glob = initialise_server(alg, cfg, len(manifest["items"]), manifest["n_clients"],
                                    manifest["seed"])
        local = initialise_client(alg, cfg, self._private(manifest, train, users), glob,
                                  manifest["seed"], manifest["client_index"])
        st = self.state
        st.write(job_id, "manifest.json", json.dumps(manifest).encode())
        st.write(job_id, "users.json", json.dumps(users.tolist()).encode())
        st.write(job_id, "train.block", train.to_bytes())
        st.write(job_id, "test.block", test.to_bytes())
        st.write(job_id, "local.msg", local.to_bytes())
        st.write(job_id, "global.msg", glob.to_bytes())
        st.jobs[str(job_id)] = {"client_index": manifest["client_index"], "local_round": 0,
                                "seen": 0, "releases": 0, "charged": {}, "pending": None,
                                "late": [], "done": False}
        st.save()
        self.log(f"joined job {job_id} as client {manifest['client_index']} of "
                 f"{manifest['n_clients']} ({block.nnz} ratings of {block.n_users} users; "
                 f"{train.nnz} train, {test.nnz} test)")

    @staticmethod
    def _alg(manifest: dict[str, Any]):
        """The job's algorithm and config; one this release does not know (a coordinator
        on a newer release) is refused naming what to upgrade, not with a traceback."""
        upgrade = f"install the coordinator's fedrec release here (this is {_version()})"
        try:
            alg = registry.get(manifest["algorithm"])
        except KeyError:
            raise ValueError(f"job {manifest['job_id']}: algorithm "
                             f"{manifest['algorithm']!r} is unknown to this agent; "
                             f"{upgrade}") from None
        try:
            return alg, alg.config(**manifest["config"])
        except ValidationError as exc:
            unknown = [".".join(map(str, e["loc"])) for e in exc.errors()
                       if e["type"] == "extra_forbidden"]
            if not unknown:
                raise ValueError(f"job {manifest['job_id']}: the coordinator's config is "
                                 f"invalid here ({exc.errors()[0]['msg']})") from None
            raise ValueError(f"job {manifest['job_id']}: the job's {alg.name} config has "
                             f"fields this agent does not know ({', '.join(unknown)}); "
                             f"{upgrade}") from None

    def manifest(self, job_id: int) -> dict[str, Any]:
        return self._load(job_id, "manifest.json", json.loads)

    def _load(self, job_id: int, name: str, parse: Callable[[bytes], Any]) -> Any:
        """A state file parsed, kept in memory (the file stays the durable copy)."""
        key = (int(job_id), name)
        if key not in self._memo:
            self._memo[key] = parse(self.state.read(job_id, name))
        return self._memo[key]

    # ---- one step of one job ---------------------------------------------------------
    def step(self, job_id: int, wait: float) -> bool:
        """Do what the job needs of this tenant now (waiting up to ``wait`` seconds for it);
        False once the job has ended for this agent."""
        rec = self.state.jobs[str(job_id)]
        if rec["pending"] is not None:
            with self.exclusive():
                self._send_pending(job_id)
            return True
        status = self.coord.round(job_id, wait=wait, after=rec["seen"])
        with self.exclusive():
            return self._act(job_id, rec, status)

    def _act(self, job_id: int, rec: dict[str, Any], status: dict[str, Any]) -> bool:
        if status["completed_rounds"] > rec["seen"]:
            self._observe(job_id, status["completed_rounds"])
        if status["phase"] == "closed":
            self._finish(job_id, status["status"])
            return False
        if status["phase"] == "upload":
            self._run_round(job_id, status["round"])
        return True

    def _observe(self, job_id: int, completed: int) -> None:
        """A round completed: keep its global message and say the local test error."""
        rec = self.state.jobs[str(job_id)]
        done, _, gbytes = self.coord.global_msg(job_id)
        self.state.write(job_id, "global.msg", gbytes, durable=False)  # fetched again at will
        self._memo[(int(job_id), "global")] = (done, gbytes)
        rec["seen"] = done
        self.state.save()
        rmse = self.local_rmse(job_id)
        self.log(f"job {job_id}: round {done} of {self.manifest(job_id)['rounds']} done; "
                 f"local test RMSE {rmse:.4f}")

    def local_rmse(self, job_id: int) -> float:
        manifest = self.manifest(job_id)
        alg, _ = self._alg(manifest)
        sq, _, n = tenant_errors(alg, Message.from_bytes(self.state.read(job_id, "global.msg")),
                                 Message.from_bytes(self.state.read(job_id, "local.msg")),
                                 RatingBlock.from_bytes(self.state.read(job_id, "test.block")),
                                 tuple(manifest["tenant_scale"]))
        return float(np.sqrt(sq / n)) if n else float("nan")

    def _run_round(self, job_id: int, round_: int) -> None:
        rec = self.state.jobs[str(job_id)]
        if (round_ <= rec["local_round"] or round_ in rec["late"]
                or str(round_) in rec["charged"]):
            # this tenant took part in the round already (sent, declined, charged or
            # turned away as late): whatever the coordinator says, a round is released
            # at most once, so a stale or hostile "upload" answer costs no second charge
            if (job_id, round_) not in self._not_again:
                self._not_again.add((job_id, round_))
                self.log(f"job {job_id}: round {round_} was this tenant's already; not "
                         "running it again")
            return
        done, gbytes = self._memo.get((int(job_id), "global"), (None, b""))
        if done != round_ - 1:  # not fetched yet when the round completed
            done, _, gbytes = self.coord.global_msg(job_id)
        if done != round_ - 1:
            return  # the round moved on meanwhile: poll again
        st, rec, manifest = self.state, self.state.jobs[str(job_id)], self.manifest(job_id)
        alg, cfg = self._alg(manifest)
        seed, client = manifest["seed"], manifest["client_index"]
        release = self._release(manifest, rec, alg, cfg)
        local, sent = client_round(alg, cfg, round_, seed, client, Message.from_bytes(gbytes),
                                   self._load(job_id, "local.msg", Message.from_bytes),
                                   self._train(job_id, manifest), release)
        pending: dict[str, Any] = {"round": round_, "kind": "none", "charge": None}
        if release.refused is not None:
            self.log(f"job {job_id}: refusing to transmit in round {round_}: "
                     f"{release.refused}; telling the coordinator this tenant declines")
            pending.update(kind="decline", reason=release.refused)
        elif sent is not None:
            pending.update(kind="upload", charge=release.event.as_list())
            rec["charged"][str(round_)] = release.event.as_list()
            st.write(job_id, f"pending-{round_}.upload", on_wire(sent, manifest["wire"]),
                     durable=False)
        st.write(job_id, f"pending-{round_}.local", local.to_bytes(), durable=False)
        sync_files(st.job_dir(job_id), [f"pending-{round_}.upload", f"pending-{round_}.local"])
        self._memo[(int(job_id), f"pending-{round_}.local")] = local
        rec["pending"] = pending
        st.save()  # the charge and the pending upload, together, before anything is sent
        if os.environ.get(FAULT) == f"die-before-send:{round_}":
            os._exit(137)  # fault injection (tests): killed between charging and sending
        self._send_pending(job_id)

    def _private(self, manifest: dict[str, Any], train: RatingBlock, users) -> RatingBlock:
        """The training block with the tenant's secret per-user draws under user-level DP
        (:func:`privacy.randomness.with_user_draws`, the agent's own key)."""
        if not release_of(manifest["privacy"]).user_level:
            return train
        return with_user_draws(train, self.state.user_draws_key, self.state.account,
                               [str(u) for u in users])

    def _train(self, job_id: int, manifest: dict[str, Any]) -> RatingBlock:
        """The job's training block as the client step uses it (parsed once)."""
        key = (int(job_id), "train.private")
        if key not in self._memo:
            users = self._load(job_id, "users.json", json.loads)
            self._memo[key] = self._private(
                manifest, self._load(job_id, "train.block", RatingBlock.from_bytes), users)
        return self._memo[key]

    def _release(self, manifest: dict[str, Any], rec: dict[str, Any], alg, cfg
                 ) -> UploadRelease:
        """The release of this round's upload on the agent's *own* ledger: check budget,
        privatise, charge as :class:`privacy.release.UploadRelease` decides for the job's
        settings, as a hosted tenant's (under secure aggregation only the charge here; the
        noise and the masks in :mod:`agent.secure`)."""
        return UploadRelease(manifest["privacy"], alg.name, cfg, self.state.account,
                             lambda: (self.state.ledger, rec["releases"]),
                             manifest["privacy_preserving"])

    def _send_pending(self, job_id: int) -> None:
        st, rec = self.state, self.state.jobs[str(job_id)]
        pending, manifest = rec["pending"], self.manifest(job_id)
        k = pending["round"]
        uploader = self.secure if manifest.get("secure_aggregation") else self.uploader
        try:
            if pending["kind"] == "upload":
                answer = uploader(self.coord, manifest, k,
                                       st.read(job_id, f"pending-{k}.upload"),
                                       pending["charge"])
            elif pending["kind"] == "none":
                answer = uploader(self.coord, manifest, k, b"", None)
            else:
                answer = self.coord.decline(job_id, k, pending["reason"])
        except Refused as exc:
            if exc.status != 409 or "duplicate" in exc.detail:
                raise
            self.log(f"job {job_id}: round {k} went on without this tenant ({exc.detail}); "
                     "its local state stays as it was (any charge stays on the ledger)")
            rec["late"].append(k)
            self._memo.pop((int(job_id), f"pending-{k}.local"), None)
            rec["pending"] = None
            st.save()
            self._drop(job_id, k)
            return
        if answer is None:  # secure aggregation under way: the next step goes on with it
            return
        st.rename(job_id, f"pending-{k}.local", "local.msg")
        adopted = self._memo.pop((int(job_id), f"pending-{k}.local"), None)
        if adopted is None:
            self._memo.pop((int(job_id), "local.msg"), None)
        else:
            self._memo[(int(job_id), "local.msg")] = adopted
        rec["local_round"] = k
        if pending["kind"] == "upload":
            rec["releases"] += 1
        rec["pending"] = None
        st.save()
        self._drop(job_id, k)
        what = {"upload": "sent its upload", "none": "had nothing to send",
                "decline": "declined"}[pending["kind"]]
        replay = " (replayed)" if answer.get("replayed") else ""
        self.log(f"job {job_id}: round {k}: {what}{replay}; epsilon spent "
                 f"{self.epsilon_spent():.4g}")

    def _drop(self, job_id: int, k: int) -> None:
        self.secure.forget(job_id, k)
        self.state.drop(job_id, f"pending-{k}.upload")
        self.state.drop(job_id, f"pending-{k}.local")

    def epsilon_spent(self) -> float:
        return self.state.ledger.spent(self.state.account).epsilon

    def _finish(self, job_id: int, status: str) -> None:
        rec = self.state.jobs[str(job_id)]
        _, _, gbytes = self.coord.global_msg(job_id)
        self.state.write(job_id, "global.msg", gbytes)
        self._memo = {k: v for k, v in self._memo.items() if k[0] != int(job_id)}
        rec["done"], rec["status"] = True, status
        self.state.save()
        self.log(f"job {job_id} {status}; local test RMSE {self.local_rmse(job_id):.4f}; "
                 f"epsilon spent {self.epsilon_spent():.4g}")

    # ---- the loop --------------------------------------------------------------------
    def run(self, until_done: bool = False, poll: float = 20.0,
            max_seconds: float | None = None) -> int:
        """Take part in every enrolled job; with ``until_done`` return once every job
        joined has ended (after at least one)."""
        start = time.monotonic()
        while max_seconds is None or time.monotonic() - start < max_seconds:
            self.sync_forgotten()
            jobs = self.coord.jobs()
            active = []
            for job in sorted(jobs, key=lambda j: j["id"]):
                rec = self.state.jobs.get(str(job["id"]))
                if rec is not None and rec["done"]:
                    continue
                if rec is not None or job["status"] in RUNNING:
                    active.append(job["id"])
            if not active:
                if until_done and self.state.jobs:
                    return 0
                time.sleep(min(poll, 2.0))
                continue
            for job_id in active:
                if str(job_id) not in self.state.jobs:
                    self.setup(job_id)
                self.step(job_id, wait=poll if len(active) == 1 else 0.5)
        return 0


def _serving_job(root: Path, jobs: list[int]) -> int:
    """The latest of ``jobs`` whose model is a ranking model, else the latest."""
    def kind(j: int) -> str:
        where = root / "jobs" / str(j) / "manifest.json"
        if not where.is_file():
            return "rating"
        return registry.model_kind(json.loads(where.read_text())["algorithm"])

    ranking = [j for j in jobs if kind(j) == "ranking"]
    return (ranking or jobs)[-1]


def recommend(root: Path | str, user: str, k: int = 10, job_id: int | None = None
              ) -> list[dict[str, Any]]:
    """User ``user``'s top-k unseen items from the local U and the last global V of a job
    (when ``job_id`` is None: the latest joined of a ranking model, the model that serves
    lists, else the latest joined)."""
    state = json.loads((Path(root) / "agent.json").read_text())
    jobs = sorted(int(j) for j in state["jobs"])
    if not jobs:
        raise ValueError(f"no job in {root}: run 'fedrec agent run' first")
    job_id = _serving_job(Path(root), jobs) if job_id is None else job_id
    where = Path(root) / "jobs" / str(job_id)
    manifest = json.loads((where / "manifest.json").read_text())
    users = json.loads((where / "users.json").read_text())
    if not user or user not in users or user in agent_forget.load(root)["users"]:
        raise ValueError(f"unknown user {user!r} in job {job_id} (no ratings, or forgotten)")
    row = users.index(user)
    alg = registry.get(manifest["algorithm"])
    a, b = alg.factors(Message.from_bytes((where / "global.msg").read_bytes()),
                       Message.from_bytes((where / "local.msg").read_bytes()))
    seen = [RatingBlock.from_bytes((where / f).read_bytes()) for f in ("train.block",
                                                                       "test.block")]
    exclude = np.unique(np.concatenate([blk.cols[blk.rows == row] for blk in seen]))
    items, scores = top_k(np.asarray(a[row] @ b), k, exclude)
    titles = manifest.get("titles") or [None] * len(manifest["items"])
    return [{"item": manifest["items"][int(j)], "title": titles[int(j)], "score": float(s)}
            for j, s in zip(items, scores, strict=True)]
