"""Admin: the shared item catalogue."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from sqlalchemy import func, select

from app import store
from app.deps import UNPROCESSABLE, SessionDep, SettingsDep, check_limit, errors, require_admin
from app.models import Item
from app.routes import API_PREFIX
from app.schemas import ItemPublic, ItemsPublic, ItemsUpsert, ItemsUpserted, Limit, Offset

router = APIRouter(prefix=API_PREFIX + "/admin/items", tags=["admin: items"],
                   dependencies=[Depends(require_admin)], responses=errors(401, 429))


@router.put("", response_model=ItemsUpserted, responses=errors(400))
def upsert_items(session: SessionDep, body: ItemsUpsert) -> ItemsUpserted:
    """Add items to the catalogue or update their titles (keyed by external key)."""
    latest = {item.key: item.title for item in body.items}
    store.upsert_items(session, sorted(latest.items()))
    session.commit()
    return ItemsUpserted(upserted=len(latest))


@router.get("", response_model=ItemsPublic, responses=UNPROCESSABLE)
def read_items(session: SessionDep, settings: SettingsDep,
               offset: Offset = 0, limit: Limit = 100) -> ItemsPublic:
    """A page of the catalogue in id order; ``count`` is the catalogue size."""
    check_limit(("query", "limit"), limit, settings.max_page_size, "FEDREC_MAX_PAGE_SIZE")
    items = session.scalars(select(Item).order_by(Item.id).offset(offset).limit(limit)).all()
    count = int(session.scalar(select(func.count()).select_from(Item)))
    return ItemsPublic(data=[ItemPublic.model_validate(i) for i in items], count=count)
