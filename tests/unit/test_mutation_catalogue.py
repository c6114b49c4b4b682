"""The mutant catalogue (``./dev mutants``) stays applicable: every mutant's text occurs exactly
once in its file, so a refactor cannot silently turn a mutant into a no-op that "survives"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutation.catalogue import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_each_mutant_applies_exactly_once(mutant: Mutant) -> None:
    text = (ROOT / mutant.file).read_text(encoding="utf-8")
    assert text.count(mutant.original) == 1, (
        f"{mutant.id}: its original text occurs {text.count(mutant.original)} times in "
        f"{mutant.file}; update tests/mutation/catalogue.py to the current code"
    )
    assert mutant.replacement != mutant.original


def test_mutant_ids_are_unique() -> None:
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids))
