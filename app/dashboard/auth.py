"""Dashboard sign-in: the admin token or a tenant API key, checked by the API's own rules
(:mod:`app.deps`), then kept in an HttpOnly, SameSite=Strict cookie.

The cookie holds the presented secret encrypted and authenticated (Fernet) under a key
derived from the admin token, with its issue time: every page re-checks the secret exactly
as the API checks a bearer token, so a revoked key or a changed admin token ends the
session, and a tampered or stale cookie (older than :data:`SESSION_SECONDS`) is refused.
Signing out revokes the cookie in the database (:func:`revoke`), so a copy of it is
refused by every API process too.
Every form carries a CSRF token bound to the session cookie (an HMAC of it).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import hmac
import secrets

import sqlalchemy as sa
from cryptography.fernet import Fernet, InvalidToken
from fastapi import HTTPException, Request
from sqlalchemy.orm import Session

from app.deps import verified_tenant
from app.models import RevokedSession, Tenant
from app.security import key_prefix, same_secret

COOKIE = "fedrec_session"
LOGIN_CSRF_COOKIE = "fedrec_login_csrf"
SESSION_SECONDS = 8 * 3600


class SignInRequired(Exception):
    """No valid session: the page answers with a redirect to the sign-in form."""


class PageNotFound(Exception):
    """A 404 page (also what a tenant gets for any other tenant's page: never 403)."""

    def __init__(self, detail: str = "Page not found") -> None:
        super().__init__(detail)
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class Viewer:
    """Who is signed in: the operator (``tenant`` None) or one tenant."""

    tenant: Tenant | None
    csrf: str

    @property
    def is_admin(self) -> bool:
        return self.tenant is None


def _key(request: Request) -> bytes:
    token = request.app.state.admin_token.encode()
    return hashlib.sha256(b"fedrec-dashboard-session\0" + token).digest()


def _fernet(request: Request) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(_key(request)))


def _csrf_for(request: Request, cookie: str) -> str:
    return hmac.new(_key(request), b"csrf\0" + cookie.encode(), hashlib.sha256).hexdigest()


def check_secret(request: Request, session: Session, secret: str) -> Tenant | None:
    """None for the admin token, the tenant for a valid API key; 401 HTTPException
    otherwise (the same checks as a bearer token on the API)."""
    if same_secret(secret, request.app.state.admin_token, hashed=False):
        return None
    if key_prefix(secret) is None:
        raise HTTPException(401, "Not the admin token, nor a tenant API key (fk_...)")
    return verified_tenant(request, session, secret)


def session_cookie(request: Request, secret: str) -> str:
    return _fernet(request).encrypt(secret.encode()).decode()


def _digest(cookie: str) -> str:
    return hashlib.sha256(cookie.encode()).hexdigest()


def viewer(request: Request, session: Session) -> Viewer:
    """The signed-in viewer; :class:`SignInRequired` when there is none."""
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        raise SignInRequired
    try:
        secret = _fernet(request).decrypt(cookie.encode(), ttl=SESSION_SECONDS).decode()
    except InvalidToken:
        raise SignInRequired from None
    if session.get(RevokedSession, _digest(cookie)) is not None:
        raise SignInRequired
    try:
        tenant = check_secret(request, session, secret)
    except HTTPException:
        raise SignInRequired from None
    return Viewer(tenant, _csrf_for(request, cookie))


def revoke(request: Request, session: Session) -> None:
    """End the request's session for every API process (signing out): its cookie is
    refused from now on, not only deleted from this browser. Expired revocations go."""
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        return
    issued = _fernet(request).extract_timestamp(cookie.encode())
    now = dt.datetime.now(dt.UTC)
    session.execute(sa.delete(RevokedSession).where(RevokedSession.expires_at < now))
    if session.get(RevokedSession, _digest(cookie)) is None:
        session.add(RevokedSession(digest=_digest(cookie), expires_at=dt.datetime.fromtimestamp(
            issued + SESSION_SECONDS, dt.UTC)))
    session.commit()


def check_csrf(viewer_: Viewer, token: str | None) -> None:
    """403 unless ``token`` is the session's CSRF token."""
    if not token or not hmac.compare_digest(token, viewer_.csrf):
        raise HTTPException(403, "The form's CSRF token is missing or stale; reload the page")


def new_login_csrf() -> str:
    return secrets.token_urlsafe(24)


def cookie_options(request: Request) -> dict:
    """HttpOnly, SameSite=Strict; Secure over https and always in production (behind a
    TLS-terminating proxy the app itself may see plain http)."""
    secure = (request.url.scheme == "https"
              or request.app.state.settings.env == "production")
    return {"httponly": True, "samesite": "strict", "path": "/", "secure": secure}
