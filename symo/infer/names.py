"""Layout -> `Spec`: readable space names, sizes where the shapes cannot decide them, and `{i}` patterns
so that one line covers every repeated block."""

from __future__ import annotations

import re
from collections import Counter

from ..compiler import ParamRule, SpaceDecl, Spec
from .layout import Layout, is_free
from .relax import PIECES_ROLE, piece_role

_CAPTURES = "ijklmn"


def _module_parts(name: str) -> list[str]:
    parts = name.split(".")[:-1] or name.split(".")
    return [re.sub(r"\W", "_", p) for p in parts if not p.isdigit()]


def _indices(name: str) -> tuple[str, ...]:
    return tuple(p for p in name.split(".") if p.isdigit())


def _join(base: str, idx: tuple[str, ...]) -> str:
    if not idx:
        return base
    return base + ("_" if base[-1].isdigit() else "") + "_".join(idx)


def name_spaces(layout: Layout) -> dict[int, tuple[str, tuple[str, ...]]]:
    """space id -> (base, indices): the name is base + indices; indices are the layer numbers shared
    by every parameter that carries the space (a residual stream spans layers and has none)."""
    order = list(layout.shapes)
    info = {}
    for sid, s in layout.spaces.items():
        params = sorted(s.params, key=order.index)
        idx = {_indices(p) for p in params}
        info[sid] = (params, idx.pop() if len(idx) == 1 else ())
    owners = {s.per for s in layout.spaces.values() if s.per is not None}
    res = [sid for sid, s in layout.spaces.items() if "res" in s.roles and s.group != "identity" and sid not in owners]

    def candidates(sid: int) -> list[str]:
        s = layout.spaces[sid]
        params, _ = info[sid]
        parts = _module_parts(params[0]) if params else []
        if not parts:  # nn.Sequential: the module path is all numbers ("0.weight"): name it after them
            parts = ["h" + "_".join(_indices(params[0]))] if params and _indices(params[0]) else ["h"]
        if s.synthetic:
            role = "fixed"
        elif "head" in s.roles and (s.group == "identity" or sid in owners):
            role = "head"
        elif "qk" in s.roles and s.per is not None:
            role = "dqk"
        elif "vo" in s.roles and s.per is not None:
            role = "dvo"
        elif sid in res:
            if len(res) == 1:
                role = "res"
            else:
                top = Counter(_module_parts(p)[0] if _module_parts(p) else "s" for p in params).most_common(1)
                role = "res_" + top[0][0]
        else:  # a fused matrix's pieces (symo/infer/relax.py) are named after their module: c_attn_pieces
            role = piece_role(s)
        out = [role] if role and not piece_role(s) else []
        for k in range(1, len(parts) + 1):
            out.append("_".join(parts[-k:] + ([role] if role else [])))
        return out or ["s"]

    cands = {sid: candidates(sid) for sid in layout.spaces}
    level = dict.fromkeys(layout.spaces, 0)
    for _ in range(8):
        names = {sid: _join(_valid(cands[sid][min(level[sid], len(cands[sid]) - 1)]), info[sid][1])
                 for sid in layout.spaces}
        clash = [sid for sid, n in names.items() if list(names.values()).count(n) > 1]
        if not clash:
            break
        for sid in clash:
            level[sid] += 1
    out, seen = {}, Counter()
    for sid in layout.spaces:
        base = _valid(cands[sid][min(level[sid], len(cands[sid]) - 1)])
        n = _join(base, info[sid][1])
        seen[n] += 1
        if seen[n] > 1:  # still clashing: number it
            base = f"{base}_v{seen[n]}"
        out[sid] = (base, info[sid][1])
    return out


def _valid(text: str) -> str:
    text = re.sub(r"\W", "_", text) or "s"
    return text if re.match(r"[A-Za-z_]", text) else "s" + text


def _declare_size(layout: Layout, sid: int) -> bool:
    s = layout.spaces[sid]
    if piece_role(s):  # a fused matrix's piece count, or an uneven piece's size, is the model's code
        return True
    if s.per is not None and PIECES_ROLE in layout.spaces[s.per].roles:
        return False
    if s.per is not None or s.synthetic:
        return True
    owners = {x.per for x in layout.spaces.values() if x.per is not None}
    if sid in owners:
        return False
    alone = any(seg == (sid,) for axes in layout.axes.values() for axis in axes for seg in axis)
    return not alone


def _axis_text(seg: tuple, names: dict[int, str]) -> tuple[str, ...]:
    if len(seg) == 1 and is_free(seg[0]):
        return ("_",)
    return tuple(names[x] for x in seg)


def build_spec(layout: Layout, names: dict[int, tuple[str, tuple[str, ...]]], title: str,
               template: bool = True) -> Spec:
    """The spec of a layout; `template` folds repeated blocks into `{i}` patterns where that is exact."""
    literal = {sid: _join(b, idx) for sid, (b, idx) in names.items()}
    sized = {sid: _declare_size(layout, sid) for sid in layout.spaces}

    def decl(sid: int, name: str, owner: str | None) -> SpaceDecl:
        s = layout.spaces[sid]
        return SpaceDecl(name=name, group=s.group, size=s.size if sized[sid] else None, per=owner)

    # families: spaces named base + indices; uniform if every instance declares the same thing
    family_of = {sid: (b, len(idx)) for sid, (b, idx) in names.items() if idx}
    templated_ok: dict[tuple, bool] = {}
    for sid, fam in family_of.items():
        s = layout.spaces[sid]
        owner = family_of.get(s.per) if s.per is not None else None
        key = (s.group, s.size if sized[sid] else None, owner, s.per is not None and s.per not in family_of)
        templated_ok.setdefault(fam, key)
        if templated_ok[fam] != key:
            templated_ok[fam] = False
    all_names = list(layout.shapes)
    groups: dict[tuple, list[str]] = {}
    for p in layout.axes:
        skel = tuple(None if c.isdigit() else c for c in p.split("."))
        groups.setdefault(skel, []).append(p)
    rules: list[ParamRule] = []
    used_literal: set[int] = set()
    used_family: set[tuple] = set()
    for skel, members in groups.items():
        ncap = sum(1 for c in skel if c is None)
        done = False
        if template and ncap and len(members) > 1 and ncap <= len(_CAPTURES):
            caps = tuple("{" + c + "}" for c in _CAPTURES[:ncap])
            it = iter(caps)
            pattern = ".".join(c if c is not None else next(it) for c in skel)
            texts, fams = set(), set()
            for p in members:
                idx = _indices(p)
                tnames = {}
                for sid in layout.spaces:
                    b, sidx = names[sid]
                    fam = family_of.get(sid)
                    if sidx and sidx == idx and len(sidx) == ncap and fam and templated_ok.get(fam):
                        tnames[sid] = _join(b, caps)
                        fams.add((fam, sid))
                    else:
                        tnames[sid] = literal[sid]
                texts.add(tuple(tuple(_axis_text(seg, tnames) for seg in axis) for axis in layout.axes[p]))
            rx = _pattern_regex(pattern)
            matched = [n for n in all_names if rx.fullmatch(n)]
            if len(texts) == 1 and sorted(matched) == sorted(members):
                (axes,) = texts
                rules.append(ParamRule(pattern=pattern, axes=axes))
                used_family.update(fam for fam, _ in fams)
                for p in members:
                    for axis in layout.axes[p]:
                        for seg in axis:
                            for x in seg:
                                if not is_free(x) and not (family_of.get(x) and templated_ok.get(family_of[x])
                                                         and names[x][1] == _indices(p)):
                                    used_literal.add(x)
                done = True
        if not done:
            for p in members:
                rules.append(ParamRule(pattern=p, axes=tuple(tuple(_axis_text(seg, literal) for seg in axis)
                                                             for axis in layout.axes[p])))
                used_literal.update(x for axis in layout.axes[p] for seg in axis for x in seg if not is_free(x))
    decls: list[SpaceDecl] = []
    declared_fams = set()
    order = sorted(layout.spaces, key=lambda sid: (_first_use(layout, sid), sid))
    for sid in order:
        fam = family_of.get(sid)
        s = layout.spaces[sid]
        if fam in used_family and fam not in declared_fams:
            declared_fams.add(fam)
            caps = tuple("{" + c + "}" for c in _CAPTURES[:fam[1]])
            owner = _join(names[s.per][0], caps) if s.per is not None and family_of.get(s.per) else (
                literal[s.per] if s.per is not None else None)
            decls.append(decl(sid, _join(fam[0], caps), owner))
        if sid in used_literal and fam not in used_family:
            decls.append(decl(sid, literal[sid], literal[s.per] if s.per is not None else None))
    # owners must be declared before use is not required, but keep owners first for readability
    decls.sort(key=lambda d: 0 if any(x.per == d.name for x in decls) else 1)
    return Spec(name=title, spaces=tuple(decls), params=tuple(rules), source="<inferred>")


def _first_use(layout: Layout, sid: int) -> int:
    for i, axes in enumerate(layout.axes.values()):
        if any(sid in seg for axis in axes for seg in axis):
            return i
    return len(layout.axes)


def _pattern_regex(pattern: str) -> re.Pattern:
    out, pos = [], 0
    for m in re.finditer(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", pattern):
        out.append(re.escape(pattern[pos:m.start()]))
        out.append(r"[^.]+?")
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return re.compile("".join(out))
