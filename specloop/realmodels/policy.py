"""A minimal fixed draft policy (used until / unless a policy from
`specloop.strategies` is passed to the decoder), and tree-shape parsing for the CLI."""
from __future__ import annotations

from specloop.record import RoundRecord
from specloop.strategies.base import DraftPlan, PlanState, TreePlan

__all__ = ["FixedDraftPolicy", "parse_tree_shape"]


class FixedDraftPolicy:
    """Always the same plan: a chain of k draft tokens, or a fixed tree.

    Args:
        num_draft_tokens: k >= 0 (chain length; for a tree, the depth cap).
        tree: optional `TreePlan`.

    Raises:
        ValueError: k < 0.
    """

    def __init__(self, num_draft_tokens: int = 5, tree: TreePlan | None = None):
        if int(num_draft_tokens) < 0:
            raise ValueError(f"num_draft_tokens (k) must be >= 0, got {num_draft_tokens}")
        if tree is not None:
            num_draft_tokens = max(int(num_draft_tokens), int(tree.max_depth))
        self._plan = DraftPlan(int(num_draft_tokens), tree)

    def plan(self, state: PlanState) -> DraftPlan:
        return self._plan

    def observe(self, record: RoundRecord) -> None:
        return None


def parse_tree_shape(shape: str) -> TreePlan:
    """Parse ``--tree`` values.

    ``"3x2x1"`` or ``"3,2,1"``: static branching per depth; ``"topk=4,depth=6"``:
    an EAGLE-2 dynamic tree; an optional ``",v=32"`` sets the verification size.
    A branching list may take ``depth=D`` with D <= its length (a shallower cut).

    Raises:
        ValueError: anything else, including ``depth=`` deeper than the branching list.
    """
    text = shape.strip().lower()
    if not text:
        raise ValueError("empty --tree shape")
    parts = [p for p in text.replace("x", ",").split(",") if p]
    fields: dict[str, int] = {}
    branching: list[int] = []
    try:
        for part in parts:
            if "=" in part:
                key, value = part.split("=", 1)
                fields[key.strip()] = int(value)
            else:
                branching.append(int(part))
    except ValueError:
        raise ValueError(f"cannot parse --tree {shape!r}: use e.g. 4x2x1 or topk=4,depth=5[,v=32]") from None
    unknown = set(fields) - {"topk", "depth", "v"}
    if unknown:
        raise ValueError(f"unknown --tree fields {sorted(unknown)} in {shape!r}")
    if branching and "topk" in fields:
        raise ValueError(f"--tree {shape!r}: give either a branching list or topk=, not both")
    if "topk" in fields:
        return TreePlan(top_k=fields["topk"], max_depth=fields.get("depth", 5), verify_size=fields.get("v"))
    if not branching:
        raise ValueError(f"--tree {shape!r} has no branching factors")
    if fields.get("depth", len(branching)) > len(branching):
        raise ValueError(f"--tree {shape!r}: depth={fields['depth']} is deeper than its {len(branching)} "
                         f"branching factors; give one factor per level (e.g. "
                         f"{'x'.join(map(str, branching + [1] * (fields['depth'] - len(branching))))})")
    return TreePlan(branching=tuple(branching), max_depth=fields.get("depth"), verify_size=fields.get("v"))
