r"""Secure aggregation: the coordinator learns the sum of the tenants' vectors and nothing else.

The protocol of Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal and
Seth, *Practical Secure Aggregation for Privacy-Preserving Machine Learning* (CCS 2017),
semi-honest version (its Fig. 4 without the consistency check and signatures), with
double masking and Shamir-shared secrets so that dropouts can be recovered.

Arithmetic
    Vectors are integers mod ``2^64`` (numpy ``uint64``, which wraps). Float arrays are
    encoded in fixed point (:class:`FixedPoint`: ``q = rint(x 2^f)`` as a two's-complement
    64-bit integer); the sum of ``n`` encoded vectors decodes exactly as long as every
    tenant's ``|x| <= FixedPoint.bound(n)`` = ``(2^63 - 1) / (n 2^f)`` (refused otherwise),
    so that the true integer sum cannot wrap. Each entry of the decoded sum is within
    ``n / 2^(f+1)`` of the float sum (one rounding of at most ``2^-(f+1)`` per tenant).

Phases (each a pure function; the messages are frozen dataclasses a transport can carry):

0. **advertise** (tenant): two fresh X25519 key pairs per round, ``c`` (channel: encrypts
   the shares) and ``s`` (masks); sends :class:`AdvertiseKeys`. The coordinator collects
   them into a :class:`KeyRoster` (:func:`make_roster`: U1, the threshold t, the round id).
1. **share keys** (tenant, :func:`share_keys`): draws the self-mask seed ``b_u`` (32 random
   bytes), splits ``b_u`` and the mask private key ``s_u^SK`` into t-of-|U1| Shamir shares
   (:func:`shamir_split`, over the prime field ``2^31 - 1``, the 32-byte secret as 16
   16-bit limbs), and encrypts the pair of shares for every other tenant v with
   ChaCha20-Poly1305 under ``HKDF(X25519(c_u^SK, c_v^PK))`` (a key per round, sender and
   recipient; the round, sender and recipient are the associated data). The coordinator
   routes the ciphertexts (:func:`route_shares`): U2 = the tenants whose shares arrived,
   each tenant's :class:`ShareInbox` holds the ciphertexts addressed to it.
2. **masked input** (tenant, :func:`mask_input`): ``y_u = x_u + PRG(b_u) + sum_{v in U2,
   u < v} PRG(s_uv) - sum_{v in U2, u > v} PRG(s_uv)`` mod ``2^64``, where
   ``s_uv = HKDF(X25519(s_u^SK, s_v^PK))`` and PRG is the ChaCha20 keystream under that
   key (:func:`prg`). The pairwise masks cancel in the sum over any set that contains both
   ends of every pair.
3. **unmasking** (coordinator: :func:`unmask_request`, U3 = the tenants whose masked input
   arrived, the rest of U2 dropped; tenant: :func:`unmask`): every surviving tenant
   decrypts its inbox and returns, for each survivor v, its share of ``b_v`` and, for each
   dropped v, its share of ``s_v^SK`` -- never both for the same v, and it answers one
   request per round only.
4. **sum** (coordinator, :func:`aggregate`): from any t responses it reconstructs every
   survivor's ``b`` and every dropped tenant's ``s^SK``, subtracts the self masks and the
   pairwise masks the survivors shared with dropped tenants, and returns
   ``sum_{u in U3} x_u``.

Dropouts: a tenant may drop after sending its shares (before its masked input, or before
answering the unmasking); the round completes while at least ``t`` tenants answer the
unmasking (:func:`threshold_for`: ``t = n - floor(dropout_tolerance n)``, at least
``floor(n/2) + 1``, so at most ``dropout_tolerance`` of the round's tenants may drop).
Fewer raises :class:`TooManyDropouts`, naming the counts.

What the coordinator learns (it follows the protocol and keeps every message): the sum
over the survivors U3, and who advertised, shared, sent a masked input and answered. A
survivor's ``y_u`` is hidden by the pairwise masks with the other survivors, whose seeds
need ``s^SK`` of one end, which the honest tenants never release for a survivor; a dropped
tenant's late ``y_v`` stays hidden by ``PRG(b_v)``, whose shares are released only for
survivors. Fewer than t shares of a secret carry no information about it (Shamir). A
coalition of the coordinator and fewer than t tenants learns nothing beyond the sum of the
other survivors' inputs (Bonawitz et al., Thm. 6.3 / A.2, semi-honest); tenants without
the coordinator see only their own shares (under AEAD) and the published result. Not
covered: an *active* coordinator that lies to different tenants about who dropped (the
paper's consistency round with signatures and t > 2n/3 would be needed).

:func:`run_round` drives every phase in-process (tests, simulation, benchmarks); the
distributed discrete Gaussian that tenants add before masking is
:func:`discrete_gaussian`.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from privacy import samplers

#: the vectors are integers modulo 2^64
MODULUS_BITS = 64
#: Shamir shares live in GF(p), p = 2^31 - 1 (products of two elements fit in int64)
FIELD = (1 << 31) - 1
#: a 32-byte secret is shared as 16 limbs of 16 bits, each an element of GF(p)
LIMBS = 16
SECRET_BYTES = 32
DEFAULT_DROPOUT_TOLERANCE = 0.1


class SecAggError(ValueError):
    """A protocol message is missing, malformed or inconsistent."""


class TooManyDropouts(SecAggError):
    """Fewer than t tenants remain: the sum cannot be recovered (and nothing is revealed)."""


# --------------------------------------------------------------------------- fixed point

@dataclasses.dataclass(frozen=True)
class FixedPoint:
    """Fixed-point code of float vectors in Z_{2^64}: ``q = rint(x 2^frac_bits)``."""

    frac_bits: int = 20

    def __post_init__(self) -> None:
        if not 0 <= self.frac_bits <= 52:
            raise ValueError(f"frac_bits must be in [0, 52], got {self.frac_bits!r}")

    @property
    def scale(self) -> float:
        return float(2 ** self.frac_bits)

    def bound(self, n_parties: int) -> float:
        """Largest |x| a tenant may encode so that the sum of ``n_parties`` cannot wrap."""
        return (2.0 ** 63 - 1) / (max(int(n_parties), 1) * self.scale) * (1 - 2 ** -40)

    def quantise(self, x: np.ndarray, n_parties: int) -> np.ndarray:
        """``rint(x 2^f)`` as int64; refuses values beyond :meth:`bound` (or not finite)."""
        x = np.asarray(x, dtype=np.float64)
        limit = self.bound(n_parties)
        if not np.all(np.isfinite(x)) or (x.size and float(np.max(np.abs(x))) > limit):
            worst = float(np.max(np.abs(x))) if x.size else 0.0
            raise SecAggError(f"value {worst:.6g} outside the fixed-point range +-{limit:.6g} "
                              f"for {n_parties} tenants at {self.frac_bits} fractional bits")
        return np.rint(x * self.scale).astype(np.int64)

    def encode(self, x: np.ndarray, n_parties: int) -> np.ndarray:
        """:meth:`quantise`, flattened, as uint64 (two's complement)."""
        return self.quantise(x, n_parties).ravel().view(np.uint64)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The signed value of a sum of encodings (uint64) as floats."""
        return np.asarray(total, dtype=np.uint64).view(np.int64).astype(np.float64) / self.scale

    def error_bound(self, n_parties: int) -> float:
        """Largest |decoded sum - float sum| per entry: one rounding per tenant."""
        return n_parties * 0.5 / self.scale


# --------------------------------------------------------------------------- primitives

def _hkdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def prg(key: bytes, length: int) -> np.ndarray:
    """``length`` uint64 words of the ChaCha20 keystream under the 32-byte ``key``
    (counter and nonce 0: every key is used for one stream only)."""
    enc = Cipher(algorithms.ChaCha20(key, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(enc.update(bytes(8 * length)), dtype="<u8").astype(np.uint64,
                                                                             copy=False)


def _pub(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _priv_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def _agree(priv: X25519PrivateKey, pub: bytes) -> bytes:
    return priv.exchange(X25519PublicKey.from_public_bytes(pub))


def _tag(round_id: bytes, *ids: int) -> bytes:
    return round_id + b"".join(int(i).to_bytes(8, "big") for i in ids)


def mask_key(priv: X25519PrivateKey, other_pub: bytes, round_id: bytes, u: int, v: int
             ) -> bytes:
    """Seed s_uv of the pairwise mask of tenants u and v (symmetric in u, v)."""
    lo, hi = min(u, v), max(u, v)
    return _hkdf(_agree(priv, other_pub), b"fedrec-secagg-mask" + _tag(round_id, lo, hi))


def _channel_key(priv: X25519PrivateKey, other_pub: bytes, round_id: bytes, sender: int,
                 recipient: int) -> bytes:
    return _hkdf(_agree(priv, other_pub),
                 b"fedrec-secagg-share" + _tag(round_id, sender, recipient))


def _self_mask_key(seed: bytes, round_id: bytes, u: int) -> bytes:
    return _hkdf(seed, b"fedrec-secagg-self" + _tag(round_id, u))


def _mask_sign(u: int, v: int) -> int:
    return 1 if u < v else -1


# --------------------------------------------------------------------------- Shamir

def _random_field(shape: tuple[int, ...]) -> np.ndarray:
    """Uniform elements of GF(p) from the OS CSPRNG (rejection of the one value p)."""
    size = int(np.prod(shape))
    out = np.empty(0, dtype=np.int64)
    while out.size < size:
        draw = np.frombuffer(os.urandom(4 * (size - out.size + 8)), dtype="<u4")
        draw = (draw & 0x7FFFFFFF).astype(np.int64)
        out = np.concatenate([out, draw[draw < FIELD]])
    return out[:size].reshape(shape)


def _limbs(secret: bytes) -> np.ndarray:
    if len(secret) != SECRET_BYTES:
        raise SecAggError(f"a shared secret has {SECRET_BYTES} bytes, got {len(secret)}")
    return np.frombuffer(secret, dtype="<u2").astype(np.int64)


def _unlimbs(limbs: np.ndarray) -> bytes:
    if np.any((limbs < 0) | (limbs >= 1 << 16)):
        raise SecAggError("reconstructed secret is not a 32-byte value (wrong or too few "
                          "shares)")
    return limbs.astype("<u2").tobytes()


def shamir_split(secret: bytes, holders: Sequence[int], threshold: int) -> dict[int, np.ndarray]:
    """t-of-n shares of a 32-byte secret: holder h gets ``f(h + 1)`` for a random polynomial
    f of degree t - 1 over GF(p) per limb with ``f(0)`` = the limb."""
    if threshold < 1:
        raise SecAggError(f"threshold must be at least 1, got {threshold}")
    coeffs = np.vstack([_limbs(secret)[None, :], _random_field((threshold - 1, LIMBS))])
    xs = np.asarray([int(h) + 1 for h in holders], dtype=np.int64)
    acc = np.zeros((xs.size, LIMBS), dtype=np.int64)
    for c in coeffs[::-1]:  # Horner, every product < 2^62
        acc = (acc * xs[:, None] + c[None, :]) % FIELD
    return {int(h): acc[i] for i, h in enumerate(holders)}


def lagrange_at_zero(holders: Sequence[int]) -> np.ndarray:
    """Coefficients l_i with ``f(0) = sum_i l_i f(x_i)`` for the points x_i = holder + 1."""
    xs = np.asarray([int(h) + 1 for h in holders], dtype=np.int64)
    if len(set(xs.tolist())) != xs.size:
        raise SecAggError("duplicate share holders")
    num = np.ones(xs.size, dtype=np.int64)
    den = np.ones(xs.size, dtype=np.int64)
    for j, xj in enumerate(xs):
        diff = (xj - xs) % FIELD
        diff[j] = 1
        own = np.full(xs.size, xj % FIELD)
        own[j] = 1
        num = num * own % FIELD
        den = den * diff % FIELD
    inv = np.asarray([pow(int(d), FIELD - 2, FIELD) for d in den], dtype=np.int64)
    return num * inv % FIELD


def shamir_combine(shares: Mapping[int, np.ndarray], coeffs: np.ndarray | None = None
                   ) -> bytes:
    """The secret from ``shares`` (holder -> limbs); exact with at least t of them."""
    holders = sorted(shares)
    lam = lagrange_at_zero(holders) if coeffs is None else coeffs
    stack = np.stack([shares[h] for h in holders])
    return _unlimbs((stack * lam[:, None] % FIELD).sum(axis=0) % FIELD)


def threshold_for(n: int, dropout_tolerance: float = DEFAULT_DROPOUT_TOLERANCE) -> int:
    """t for a round of ``n`` tenants: ``n - floor(dropout_tolerance n)``, at least a strict
    majority (two disjoint sets of survivors can then never both reach t)."""
    if not 0 <= dropout_tolerance < 0.5:
        raise SecAggError(f"dropout_tolerance must be in [0, 0.5), got {dropout_tolerance!r}")
    return max(n - int(math.floor(dropout_tolerance * n)), n // 2 + 1)


# --------------------------------------------------------------------------- messages

@dataclasses.dataclass(frozen=True)
class AdvertiseKeys:
    """Phase 0, tenant -> coordinator: this round's public keys."""

    sender: int
    channel_pk: bytes
    mask_pk: bytes


@dataclasses.dataclass(frozen=True)
class KeyRoster:
    """Phase 0, coordinator -> tenants: U1 (every advertised key), t, the vector length."""

    round_id: bytes
    threshold: int
    length: int
    keys: tuple[AdvertiseKeys, ...]

    @property
    def members(self) -> tuple[int, ...]:
        return tuple(k.sender for k in self.keys)

    def key(self, tenant: int) -> AdvertiseKeys:
        for k in self.keys:
            if k.sender == tenant:
                return k
        raise SecAggError(f"tenant {tenant} is not in the round's roster")


@dataclasses.dataclass(frozen=True)
class EncryptedShare:
    """One tenant's shares (of b and s^SK) for one other tenant, under AEAD."""

    sender: int
    recipient: int
    ciphertext: bytes


@dataclasses.dataclass(frozen=True)
class ShareKeys:
    """Phase 1, tenant -> coordinator: its encrypted shares, one per other member of U1."""

    sender: int
    shares: tuple[EncryptedShare, ...]


@dataclasses.dataclass(frozen=True)
class ShareInbox:
    """Phase 1, coordinator -> tenant: U2 and the ciphertexts addressed to the recipient."""

    recipient: int
    participants: tuple[int, ...]
    shares: tuple[EncryptedShare, ...]


@dataclasses.dataclass(frozen=True)
class MaskedInput:
    """Phase 2, tenant -> coordinator: y_u (uint64, the roster's length)."""

    sender: int
    y: np.ndarray


@dataclasses.dataclass(frozen=True)
class UnmaskRequest:
    """Phase 3, coordinator -> survivors: who sent a masked input (U3) and who dropped."""

    round_id: bytes
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class UnmaskResponse:
    """Phase 3, survivor -> coordinator: its shares of each survivor's b and of each dropped
    tenant's s^SK (GF(p) limbs)."""

    sender: int
    self_mask_shares: Mapping[int, np.ndarray]
    mask_key_shares: Mapping[int, np.ndarray]


@dataclasses.dataclass
class TenantState:
    """What a tenant keeps between phases of one round (never sent)."""

    tenant: int
    round_id: bytes
    channel_sk: X25519PrivateKey
    mask_sk: X25519PrivateKey
    roster: KeyRoster | None = None
    self_seed: bytes | None = None
    own_shares: tuple[np.ndarray, np.ndarray] | None = None
    inbox: ShareInbox | None = None
    answered: bool = False


def state_to_dict(state: TenantState) -> dict[str, Any]:
    """A tenant's round state as JSON-ready data, private keys included: for the tenant's
    own disk only (an agent that restarts mid-round must reuse the same keys and seed, or
    its masks no longer cancel). Never send it."""
    return {"tenant": state.tenant, "round_id": to_wire(state.round_id),
            "channel_sk": to_wire(_priv_bytes(state.channel_sk)),
            "mask_sk": to_wire(_priv_bytes(state.mask_sk)),
            "roster": None if state.roster is None else to_wire(state.roster),
            "self_seed": None if state.self_seed is None else to_wire(state.self_seed),
            "own_shares": None if state.own_shares is None else to_wire(list(state.own_shares)),
            "inbox": None if state.inbox is None else to_wire(state.inbox),
            "answered": bool(state.answered)}


def state_from_dict(data: Mapping[str, Any]) -> TenantState:
    """Inverse of :func:`state_to_dict`."""
    def opt(key: str) -> Any:
        return None if data.get(key) is None else from_wire(data[key])
    try:
        return TenantState(
            int(data["tenant"]), from_wire(data["round_id"]),
            X25519PrivateKey.from_private_bytes(from_wire(data["channel_sk"])),
            X25519PrivateKey.from_private_bytes(from_wire(data["mask_sk"])),
            opt("roster"), opt("self_seed"), opt("own_shares"), opt("inbox"),
            bool(data["answered"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise SecAggError(f"malformed secure-aggregation state: {exc}") from exc


# --------------------------------------------------------------------------- tenant side

def advertise(tenant: int, round_id: bytes) -> tuple[TenantState, AdvertiseKeys]:
    """Phase 0: fresh key pairs for this round."""
    if tenant < 0 or tenant + 1 >= FIELD:
        raise SecAggError(f"tenant ids must be in [0, {FIELD - 2}], got {tenant}")
    c, s = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    return (TenantState(int(tenant), bytes(round_id), c, s),
            AdvertiseKeys(int(tenant), _pub(c), _pub(s)))


def share_keys(state: TenantState, roster: KeyRoster) -> ShareKeys:
    """Phase 1: Shamir-share b_u and s_u^SK among U1, each pair of shares encrypted for its
    holder."""
    if roster.round_id != state.round_id:
        raise SecAggError("roster of another round")
    members = roster.members
    if state.tenant not in members:
        raise SecAggError(f"tenant {state.tenant} is not in the roster")
    if len(members) < roster.threshold:
        raise TooManyDropouts(f"{len(members)} tenants advertised keys, fewer than the "
                              f"threshold {roster.threshold}")
    state.roster = roster
    state.self_seed = os.urandom(SECRET_BYTES)
    b_shares = shamir_split(state.self_seed, members, roster.threshold)
    s_shares = shamir_split(_priv_bytes(state.mask_sk), members, roster.threshold)
    out = []
    for v in members:
        if v == state.tenant:
            state.own_shares = (b_shares[v], s_shares[v])
            continue
        key = _channel_key(state.channel_sk, roster.key(v).channel_pk, roster.round_id,
                           state.tenant, v)
        plain = _tag(b"", state.tenant, v) + np.concatenate(
            [b_shares[v], s_shares[v]]).astype("<u4").tobytes()
        ct = ChaCha20Poly1305(key).encrypt(b"\0" * 12, plain,
                                           _tag(roster.round_id, state.tenant, v))
        out.append(EncryptedShare(state.tenant, v, ct))
    return ShareKeys(state.tenant, tuple(out))


def mask_input(state: TenantState, inbox: ShareInbox, x: np.ndarray) -> MaskedInput:
    """Phase 2: ``y_u = x_u + PRG(b_u) +- PRG(s_uv)`` for every other v in U2 (``x``: the
    tenant's encoded vector, uint64 of the roster's length)."""
    roster = state.roster
    if roster is None or state.self_seed is None:
        raise SecAggError("mask_input before share_keys")
    if inbox.recipient != state.tenant:
        raise SecAggError(f"inbox of tenant {inbox.recipient}, not {state.tenant}")
    u2 = set(inbox.participants)
    if state.tenant not in u2 or len(u2) < roster.threshold or not u2 <= set(roster.members):
        raise TooManyDropouts(f"{len(u2)} tenants shared keys (threshold "
                              f"{roster.threshold}) or this tenant is not among them")
    senders = {e.sender for e in inbox.shares}
    if senders != u2 - {state.tenant} or any(e.recipient != state.tenant
                                             for e in inbox.shares):
        raise SecAggError("the inbox does not hold exactly one share from every other "
                          "participant")
    x = np.asarray(x)
    if x.dtype != np.uint64 or x.shape != (roster.length,):
        raise SecAggError(f"masked input must be uint64 of length {roster.length}, got "
                          f"{x.dtype} {x.shape}")
    state.inbox = inbox
    y = x + prg(_self_mask_key(state.self_seed, roster.round_id, state.tenant), roster.length)
    for v in sorted(u2 - {state.tenant}):
        p = prg(mask_key(state.mask_sk, roster.key(v).mask_pk, roster.round_id,
                         state.tenant, v), roster.length)
        y = y + p if _mask_sign(state.tenant, v) > 0 else y - p
    return MaskedInput(state.tenant, y)


def _open_share(state: TenantState, e: EncryptedShare) -> tuple[np.ndarray, np.ndarray]:
    roster = state.roster
    key = _channel_key(state.channel_sk, roster.key(e.sender).channel_pk, roster.round_id,
                       e.sender, state.tenant)
    try:
        plain = ChaCha20Poly1305(key).decrypt(b"\0" * 12, e.ciphertext,
                                              _tag(roster.round_id, e.sender, state.tenant))
    except Exception as exc:  # cryptography raises InvalidTag
        raise SecAggError(f"share from tenant {e.sender} fails authentication") from exc
    if plain[:16] != _tag(b"", e.sender, state.tenant):
        raise SecAggError(f"share from tenant {e.sender} is addressed to someone else")
    limbs = np.frombuffer(plain[16:], dtype="<u4").astype(np.int64)
    return limbs[:LIMBS], limbs[LIMBS:]


def unmask(state: TenantState, request: UnmaskRequest) -> UnmaskResponse:
    """Phase 3: reveal b-shares of survivors and s^SK-shares of the dropped, once per round.

    Refuses a request that names someone both ways, leaves someone of U2 out, has fewer
    than t survivors, or comes after a first answer (a coordinator could otherwise ask for
    both secrets of one tenant)."""
    roster, inbox = state.roster, state.inbox
    if roster is None or inbox is None:
        raise SecAggError("unmask before mask_input")
    if request.round_id != roster.round_id:
        raise SecAggError("unmask request of another round")
    if state.answered:
        raise SecAggError(f"tenant {state.tenant} already answered an unmask request this "
                          "round")
    surv, drop, u2 = set(request.survivors), set(request.dropped), set(inbox.participants)
    if surv & drop or surv | drop != u2:
        raise SecAggError("the unmask request must split the round's participants into "
                          "survivors and dropped tenants")
    if state.tenant not in surv:
        raise SecAggError(f"tenant {state.tenant} is listed as dropped")
    if len(surv) < roster.threshold:
        raise TooManyDropouts(f"{len(surv)} survivors, fewer than the threshold "
                              f"{roster.threshold}")
    state.answered = True
    held = {e.sender: _open_share(state, e) for e in inbox.shares}
    held[state.tenant] = state.own_shares
    return UnmaskResponse(state.tenant, {v: held[v][0] for v in sorted(surv)},
                          {v: held[v][1] for v in sorted(drop)})


# --------------------------------------------------------------------------- coordinator side

def make_roster(adverts: Iterable[AdvertiseKeys], round_id: bytes, length: int,
                dropout_tolerance: float = DEFAULT_DROPOUT_TOLERANCE) -> KeyRoster:
    """U1 from the advertised keys; t from its size (:func:`threshold_for`)."""
    keys = tuple(sorted(adverts, key=lambda a: a.sender))
    ids = [k.sender for k in keys]
    if len(set(ids)) != len(ids):
        raise SecAggError("a tenant advertised keys twice")
    if len(keys) < 2:
        raise TooManyDropouts(f"secure aggregation needs at least 2 tenants, got {len(keys)}")
    return KeyRoster(bytes(round_id), threshold_for(len(keys), dropout_tolerance),
                     int(length), keys)


def route_shares(roster: KeyRoster, messages: Iterable[ShareKeys]) -> dict[int, ShareInbox]:
    """U2 = the senders of complete share messages; each member's inbox."""
    members = set(roster.members)
    complete = {}
    for m in messages:
        to = sorted(e.recipient for e in m.shares)
        if (m.sender in members and all(e.sender == m.sender for e in m.shares)
                and to == sorted(members - {m.sender})):
            complete[m.sender] = m
    if len(complete) < roster.threshold:
        raise TooManyDropouts(f"{len(complete)} tenants sent their shares, fewer than the "
                              f"threshold {roster.threshold}")
    u2 = tuple(sorted(complete))
    by_recipient: dict[int, list[EncryptedShare]] = {v: [] for v in u2}
    for u in u2:
        for e in complete[u].shares:
            if e.recipient in by_recipient:
                by_recipient[e.recipient].append(e)
    return {v: ShareInbox(v, u2, tuple(by_recipient[v])) for v in u2}


def unmask_request(roster: KeyRoster, participants: Sequence[int],
                   masked: Mapping[int, MaskedInput]) -> UnmaskRequest:
    """U3 = the participants whose masked input arrived; the rest dropped."""
    surv = tuple(sorted(v for v in participants if v in masked))
    if len(surv) < roster.threshold:
        raise TooManyDropouts(f"{len(surv)} of {len(participants)} tenants sent a masked "
                              f"input, fewer than the threshold {roster.threshold}: the "
                              f"round is abandoned and no share is released")
    return UnmaskRequest(roster.round_id, surv,
                         tuple(sorted(v for v in participants if v not in masked)))


def aggregate(roster: KeyRoster, request: UnmaskRequest, masked: Mapping[int, MaskedInput],
              responses: Iterable[UnmaskResponse]) -> np.ndarray:
    """Phase 4: ``sum_{u in U3} x_u`` mod 2^64 from the masked inputs and >= t responses."""
    answers = {r.sender: r for r in responses if r.sender in request.survivors}
    if len(answers) < roster.threshold:
        raise TooManyDropouts(f"{len(answers)} survivors answered the unmasking, fewer than "
                              f"the threshold {roster.threshold}")
    holders = sorted(answers)[: roster.threshold]
    lam = lagrange_at_zero(holders)
    total = np.zeros(roster.length, dtype=np.uint64)
    for u in request.survivors:
        total += masked[u].y
        seed = shamir_combine({h: answers[h].self_mask_shares[u] for h in holders}, lam)
        total -= prg(_self_mask_key(seed, roster.round_id, u), roster.length)
    for v in request.dropped:
        sk = X25519PrivateKey.from_private_bytes(
            shamir_combine({h: answers[h].mask_key_shares[v] for h in holders}, lam))
        for u in request.survivors:  # u added sign(u, v) PRG(s_uv): take it out
            p = prg(mask_key(sk, roster.key(u).mask_pk, roster.round_id, v, u),
                    roster.length)
            total = total - p if _mask_sign(u, v) > 0 else total + p
    return total


# --------------------------------------------------------------------------- driver

@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What a round produced: the sum over the survivors, who took part, the messages
    (what the coordinator relayed and kept) and the bytes each tenant sent and received."""

    total: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    roster: KeyRoster
    transcript: dict[str, Any]
    bytes_sent: dict[int, int]
    bytes_received: dict[int, int]


def message_bytes(msg: Any) -> int:
    """Payload size of a message: keys, ciphertexts, vectors and 8-byte ids."""
    if isinstance(msg, bytes):
        return len(msg)
    if isinstance(msg, np.ndarray):
        return int(msg.nbytes)
    if isinstance(msg, int):
        return 8
    if isinstance(msg, Mapping):
        return sum(8 + message_bytes(v) for v in msg.values())
    if isinstance(msg, tuple | list):
        return sum(message_bytes(v) for v in msg)
    if dataclasses.is_dataclass(msg):
        return sum(message_bytes(getattr(msg, f.name)) for f in dataclasses.fields(msg))
    raise TypeError(f"cannot size {type(msg)}")


def run_round(inputs: Mapping[int, np.ndarray], round_id: bytes, *,
              dropout_tolerance: float = DEFAULT_DROPOUT_TOLERANCE,
              drop_before_input: Iterable[int] = (), drop_before_unmask: Iterable[int] = (),
              timer: Callable[[str, int | None, float], None] | None = None,
              clock: Callable[[], float] | None = None) -> RoundResult:
    """Every phase in-process for tenants ``inputs`` (id -> encoded uint64 vector).

    ``drop_before_input``: tenants that vanish after sending their shares (their input is
    left out of the sum, their pairwise masks recovered); ``drop_before_unmask``: tenants
    whose input is in the sum but who do not answer the unmasking. ``timer(phase, tenant or
    None for the coordinator, seconds)`` receives the time of every step, read from
    ``clock`` (default ``time.perf_counter``; ``time.thread_time`` for CPU seconds)."""
    import time

    tick = clock or time.perf_counter

    def timed(phase: str, who: int | None, fn: Callable[[], Any]) -> Any:
        t0 = tick()
        out = fn()
        if timer is not None:
            timer(phase, who, tick() - t0)
        return out

    ids = sorted(int(i) for i in inputs)
    lengths = {np.asarray(inputs[i]).shape for i in ids}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        raise SecAggError("every input must be a flat vector of the same length")
    length = next(iter(lengths))[0]
    sent = {i: 0 for i in ids}
    recv = {i: 0 for i in ids}
    states, adverts = {}, []
    for i in ids:
        states[i], ad = timed("advertise", i, lambda i=i: advertise(i, round_id))
        adverts.append(ad)
        sent[i] += message_bytes(ad)
    roster = timed("advertise", None,
                   lambda: make_roster(adverts, round_id, length, dropout_tolerance))
    shares = []
    for i in ids:
        recv[i] += message_bytes(roster)
        msg = timed("share_keys", i, lambda i=i: share_keys(states[i], roster))
        shares.append(msg)
        sent[i] += message_bytes(msg)
    inboxes = timed("share_keys", None, lambda: route_shares(roster, shares))
    gone = set(drop_before_input)
    masked = {}
    for i in sorted(inboxes):
        recv[i] += message_bytes(inboxes[i])
        if i in gone:
            continue
        masked[i] = timed("mask_input", i,
                          lambda i=i: mask_input(states[i], inboxes[i], inputs[i]))
        sent[i] += message_bytes(masked[i])
    request = timed("unmask", None,
                    lambda: unmask_request(roster, tuple(sorted(inboxes)), masked))
    silent = set(drop_before_unmask)
    responses = []
    for i in request.survivors:
        recv[i] += message_bytes(request)
        if i in silent:
            continue
        r = timed("unmask", i, lambda i=i: unmask(states[i], request))
        responses.append(r)
        sent[i] += message_bytes(r)
    total = timed("aggregate", None, lambda: aggregate(roster, request, masked, responses))
    for i in request.survivors:
        recv[i] += total.nbytes  # the result goes back to the tenants
    transcript = {"adverts": adverts, "roster": roster, "share_keys": shares,
                  "inboxes": inboxes, "masked": masked, "request": request,
                  "responses": responses}
    return RoundResult(total, request.survivors, request.dropped, roster, transcript,
                       sent, recv)


# --------------------------------------------------------------------------- wire format

_TYPES = {c.__name__: c for c in (AdvertiseKeys, KeyRoster, EncryptedShare, ShareKeys,
                                  ShareInbox, MaskedInput, UnmaskRequest, UnmaskResponse)}


def to_wire(msg: Any) -> Any:
    """A JSON-ready form of a protocol message (bytes and arrays in base64, tagged)."""
    if isinstance(msg, bytes):
        return {"b64": base64.b64encode(msg).decode()}
    if isinstance(msg, np.ndarray):
        return {"u64" if msg.dtype == np.uint64 else "i64":
                base64.b64encode(msg.astype("<u8" if msg.dtype == np.uint64 else "<i8")
                                 .tobytes()).decode()}
    if isinstance(msg, tuple | list):
        return [to_wire(v) for v in msg]
    if isinstance(msg, Mapping):
        return {"map": [[int(k), to_wire(v)] for k, v in msg.items()]}
    if dataclasses.is_dataclass(msg):
        return {"type": type(msg).__name__,
                **{f.name: to_wire(getattr(msg, f.name)) for f in dataclasses.fields(msg)}}
    if isinstance(msg, int):
        return int(msg)
    raise TypeError(f"cannot serialise {type(msg)}")


def from_wire(data: Any) -> Any:
    """Inverse of :func:`to_wire`; malformed input raises :class:`SecAggError`."""
    try:
        if isinstance(data, list):
            return tuple(from_wire(v) for v in data)
        if isinstance(data, int):
            return data
        if isinstance(data, dict):
            if "b64" in data:
                return base64.b64decode(data["b64"], validate=True)
            if "u64" in data:
                return np.frombuffer(base64.b64decode(data["u64"], validate=True),
                                     dtype="<u8").astype(np.uint64)
            if "i64" in data:
                return np.frombuffer(base64.b64decode(data["i64"], validate=True),
                                     dtype="<i8").astype(np.int64)
            if "map" in data:
                return {int(k): from_wire(v) for k, v in data["map"]}
            cls = _TYPES[data["type"]]
            return cls(**{f.name: from_wire(data[f.name]) for f in dataclasses.fields(cls)})
    except (KeyError, TypeError, ValueError) as exc:
        raise SecAggError(f"malformed secure-aggregation message: {exc}") from exc
    raise SecAggError(f"malformed secure-aggregation message: {type(data).__name__}")


# --------------------------------------------------------------------------- distributed noise

def discrete_gaussian(shape: tuple[int, ...], sigma: float, rng: np.random.Generator
                      ) -> np.ndarray:
    """Samples of the discrete Gaussian N_Z(0, s^2) (P(k) proportional to
    exp(-k^2 / (2 s^2)) on the integers), s^2 >= sigma^2 the exact rational of
    :func:`privacy.samplers.gaussian_variance`: the exact sampler of Canonne, Kamath and
    Steinke (*The Discrete Gaussian for Differential Privacy*, NeurIPS 2020, Alg. 3), whose
    acceptance step is an integer-arithmetic Bernoulli(exp(-gamma)) drawn from uniform
    integers of ``rng`` only (:func:`privacy.samplers.discrete_gaussian`)."""
    return samplers.discrete_gaussian(shape, sigma, rng)


def ddg_tau(sigma: float, n: int) -> float:
    """tau of the sum of n independent N_Z(0, sigma^2) (Kairouz, Liu and Steinke, *The
    Distributed Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation*,
    ICML 2021, Thm. 2): ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))``; the
    sum then satisfies (eps^2 / 2)-concentrated DP with
    ``eps^2 <= Delta_2^2 / (n sigma^2) + 5 tau``."""
    return 10.0 * sum(math.exp(-2 * math.pi ** 2 * sigma ** 2 * k / (k + 1))
                      for k in range(1, n))
