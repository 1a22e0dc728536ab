"""The promotion records (intent before the tag copies, done or rolled-back after):
$GPUFORGE_STATE_DIR/promotions.json, typed by models.PromotionRecord. The promotion logic lives in
gpuforge/publish/; this module only keeps the records, atomically and under the state dir's lock.
"""

from __future__ import annotations

import datetime as dt

from gpuforge.state import store
from gpuforge.state.models import PromotionRecord, PromotionsFile

NAME = "promotions.json"
FIX = "move it aside and check the registry's tags (`gpuforge status`) before promoting again"


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def load() -> list[PromotionRecord]:
    return store.load(NAME, PromotionsFile, fix=FIX).promotions


def get(promotion_id: str) -> PromotionRecord | None:
    return next((p for p in load() if p.id == promotion_id), None)


def save(rec: PromotionRecord) -> PromotionRecord:
    """Insert the record, or replace the one with its id (keeping its place in the order)."""
    rec = PromotionRecord.model_validate(rec.model_dump())

    def change(doc: PromotionsFile) -> None:
        for i, p in enumerate(doc.promotions):
            if p.id == rec.id:
                doc.promotions[i] = rec
                return
        doc.promotions.append(rec)

    store.update(NAME, PromotionsFile, change, fix=FIX)
    return rec


def unfinished(target: str | None = None) -> list[PromotionRecord]:
    """Promotions whose intent was written but never a done or rolled-back: interrupted runs."""
    return [p for p in load() if p.state == "intent" and (target is None or p.target == target)]
