"""The tenant's side of secure aggregation over HTTP (:mod:`privacy.secagg`).

:class:`SecAggUploader` replaces :func:`agent.run.plain_upload` for a job with
``secure_aggregation``: the agent has already checked its own budget and charged its ledger
for the round's release (:func:`privacy.distributed.charge_release`) and holds the bounded,
un-noised upload locally. The uploader then advertises this round's keys, sends its
encrypted shares once the roster is out, sends ``tenant_input`` (quantised, with its part of
the distributed discrete Gaussian noise from a fresh secret generator,
:func:`privacy.randomness.fresh_noise_generator`) masked once its share inbox is out, and
answers the unmask request. The upload itself,
noised or not, never leaves the agent.

Restart-safe: before each message is posted, the protocol state (:func:`state_to_dict`)
and the message are written durably to ``secagg-<round>.json`` in the job's state
directory, so an agent restarted at any point posts the very same bytes again (a replay
for the coordinator) and never draws a second set of keys, shares or noise for a round.
One call makes what progress it can (long-polling up to ``wait`` seconds for the next
phase) and returns None while the round's protocol is still under way.
"""

from __future__ import annotations

import json
from typing import Any

from agent.client import Coordinator, Refused
from agent.state import AgentState
from algorithms import Message, registry
from privacy import distributed, secagg, user_level
from privacy.randomness import fresh_noise_generator

PHASES = ("keys", "shares", "masked", "unmask")
#: what each phase needs from the coordinator before it can be sent
NEEDS = {"keys": None, "shares": "roster", "masked": "inbox", "unmask": "request"}


class SecAggUploader:
    """Sends one round's release through the secure-aggregation phases."""

    def __init__(self, state: AgentState, wait: float = 5.0) -> None:
        self.state, self.wait = state, wait

    def _file(self, round_: int) -> str:
        return f"secagg-{int(round_)}.json"

    def _load(self, job_id: int, round_: int) -> dict[str, Any]:
        try:
            return json.loads(self.state.read(job_id, self._file(round_)))
        except FileNotFoundError:
            return {"state": None, "sent": {}}

    def _save(self, job_id: int, round_: int, rec: dict[str, Any]) -> None:
        self.state.write(job_id, self._file(round_), json.dumps(rec).encode())  # durable

    def forget(self, job_id: int, round_: int) -> None:
        self.state.drop(job_id, self._file(round_))

    def __call__(self, coordinator: Coordinator, manifest: dict[str, Any], round_: int,
                 data: bytes, charge: list | None) -> dict[str, Any] | None:
        job_id = manifest["job_id"]
        if not data:  # nothing released this round: nothing to mask
            return coordinator.upload(job_id, round_, b"", None)
        rec = self._load(job_id, round_)
        status = coordinator.secagg(job_id, round_)
        answer: dict[str, Any] | None = None
        for phase in PHASES:
            if phase in rec["sent"] and phase in status["posted"]:
                answer = {"round": round_, "phase": phase, "replayed": True}
                continue
            if phase not in rec["sent"]:
                need = NEEDS[phase]
                if need is not None and status.get(need) is None:
                    if status["phase"] in ("done", "failed"):
                        raise Refused(409, f"late: secure aggregation of round {round_} is "
                                           f"{status['phase']} without this tenant "
                                           f"({status.get('reason') or 'it missed a phase'})")
                    status = coordinator.secagg(job_id, round_, wait=self.wait,
                                                after=status["phase"])
                    if status.get(need) is None:
                        return None  # not yet: the agent comes back on its next step
                message = self._make(phase, rec, status, manifest, round_, data)
                rec["sent"][phase] = secagg.to_wire(message)
                self._save(job_id, round_, rec)  # state and message first, then send
            answer = coordinator.secagg_post(job_id, round_, phase, rec["sent"][phase],
                                             charge if phase == "masked" else None)
        self.forget(job_id, round_)
        return answer

    def _make(self, phase: str, rec: dict[str, Any], status: dict[str, Any],
              manifest: dict[str, Any], round_: int, data: bytes) -> Any:
        client = manifest["client_index"]
        if phase == "keys":
            st, message = secagg.advertise(client, secagg.from_wire(status["round_id"]))
            rec["state"] = secagg.state_to_dict(st)
            return message
        st = secagg.state_from_dict(rec["state"])
        if phase == "shares":
            message = secagg.share_keys(st, secagg.from_wire(status["roster"]))
        elif phase == "masked":
            roster = st.roster
            fp = secagg.FixedPoint(status["frac_bits"])
            alg = registry.get(manifest["algorithm"])
            bounds = registry.user_bounds(alg.name, alg.config(**manifest["config"]))
            upload = Message.from_bytes(data)
            spec = user_level.from_settings(manifest["privacy"])
            index = self._releases(manifest)
            stds = distributed.integer_stds(spec, bounds, upload, index, roster.threshold, fp)
            x = distributed.tenant_input(upload, bounds, stds, len(roster.members), fp,
                                         fresh_noise_generator())
            message = secagg.mask_input(st, secagg.from_wire(status["inbox"]), x)
        else:
            message = secagg.unmask(st, secagg.from_wire(status["request"]))
        rec["state"] = secagg.state_to_dict(st)
        return message

    def _releases(self, manifest: dict[str, Any]) -> int:
        """Index of this round's release: the releases this agent completed before it."""
        return int(self.state.jobs[str(manifest["job_id"])]["releases"])
