"""Input models shared by the scenarios."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["Num", "Order"]


class Num(BaseModel):
    n: int = 0


class Order(BaseModel):
    order_id: str
    total: float
