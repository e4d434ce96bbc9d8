"""The Muon-style relaxations of an inferred layout: the specs for training.

`relax="muon"` (`symo infer --relax muon`, `symo.infer.training_spec`, what `symo.Symo(model)` uses): every
hidden matrix (a weight whose output axis and an input axis are both hidden) gets a private `signed_perm` space
on its output axis, so that its block is the matrix and the polar factor, SOAP's two Kronecker sides or any
other kind act on it as on one weight matrix. Everything else is uncovered (AdamW).

`relax="muon_pieces"`: the same, except that a fused matrix is taken as the matrices it holds. Where the trace
shows a weight's output cut into pieces (GPT's c_attn split into query, key and value; a gate and an up
projection in one Linear), each piece gets its own private row space, so its own block. Pieces of one size
share a declaration, as the bundled `gpt_muon_qkv.toml` writes it: an identity space that counts the pieces
and a signed_perm space per piece; pieces of different sizes (grouped-query attention) get one space each. On
the bundled GPT it is `gpt_muon_qkv`, `symo train`'s default spec. Measured, it is not better everywhere, so
it is not the default (docs/infer.md, "Fused matrices").
"""

from __future__ import annotations

import math

from .layout import Layout, Space, is_free

RELAXATIONS = ("muon", "muon_pieces")
PIECES_ROLE = "pieces"  # the identity space that counts a fused matrix's equal pieces
PIECE_ROLE = "piece"  # one piece of a fused matrix whose pieces differ in size (a role "piece1", "piece2", ...)
WHY = "Muon: a private row space (relaxed)"


def piece_role(space: Space) -> str | None:
    """The role that marks `space` as a fused matrix's piece count ("pieces") or one uneven piece ("piece2")."""
    return next((r for r in space.roles if r == PIECES_ROLE or (r.startswith(PIECE_ROLE)
                                                                and r[len(PIECE_ROLE):].isdigit())), None)


def muon_layout(layout: Layout, pieces: bool = False) -> Layout:
    """The Muon-style relaxation of `layout`: a private signed_perm row space per hidden matrix (`pieces`: per
    piece of a fused one); every other parameter uncovered."""
    out = Layout({}, {}, dict(layout.shapes), [], list(layout.unknown), list(layout.notes), dict(layout.out_axis))
    for name, axes in layout.axes.items():
        shape = layout.shapes[name]
        if len(shape) < 2 or name not in layout.out_axis:
            continue
        o = layout.out_axis[name]
        hidden = [any(not is_free(x) for seg in axis for x in seg) for axis in axes]
        if not hidden[o] or not any(h for i, h in enumerate(hidden[:2]) if i != o):
            continue
        sizes = [segment_size(layout, seg) for seg in axes[o]] if pieces else [shape[o]]
        rows = _row_segments(out, name, sizes)
        out.axes[name] = [rows if i == o else [(("_", n),)] for i, n in enumerate(shape)]
    return out


def segment_size(layout: Layout, seg: tuple) -> int:
    """The length of one fused segment: the product of its factors (a space's size counts once per copy)."""
    return math.prod(x[1] if is_free(x) else layout.spaces[x].size for x in seg)


def _row_segments(out: Layout, name: str, pieces: list[int]) -> list[tuple]:
    """The output axis of one hidden matrix: one private space, or one per piece of a fused matrix."""

    def space(size: int, group: str, why: str, roles: set[str] | None = None, per: int | None = None) -> int:
        sid = len(out.spaces) + 1
        out.spaces[sid] = Space(sid, size, group, why, roles=roles or set(), per=per, params=[name])
        return sid

    if len(pieces) == 1:
        return [(space(pieces[0], "signed_perm", WHY),)]
    if len(set(pieces)) == 1:
        count = space(len(pieces), "identity", f"the {len(pieces)} pieces of a fused matrix", {PIECES_ROLE})
        return [(count, space(pieces[0], "signed_perm", WHY + ", one per piece of a fused matrix", per=count))]
    return [(space(n, "signed_perm", WHY + f", piece {k} of a fused matrix", {f"{PIECE_ROLE}{k}"}),)
            for k, n in enumerate(pieces, 1)]
