"""Stage 4 for specs with families (compiler.templates): one loop per family instead of one copy per layer.

The module has the interface of compiler.codegen's (gather, scatter, BLOCKS), written through the
same emitter (compiler.emit) with the same component maps; the parameters outside families get
per-parameter code. Each family adds a member table _F<f> (names as repr literals, size names read
from N at load) and the code of its representative once, inside `for` loops whose targets are the
representative's sizes (n_mlp, d_c_fc_weight_dim1, ...). The trivial block (rows of every member) is
assembled from a list in gather and cut at a running offset in scatter.
"""

from __future__ import annotations

import json
import re

from .codegen import PIECES
from .emit import (
    STD_HELPER,
    Code,
    GeneratedCode,
    Source,
    block_meta,
    block_variables,
    code,
    components_by_block,
    define_offsets,
    gather_param,
    header,
    joined,
    read_sizes,
    scatter_header,
    scatter_param,
)
from .structure import derive_structure
from .templates import Family, TemplatePlan

NAME_HELPER = """
def _name(label, batch_spaces):
    # IsotypicBlock.name of compiler.structure, with the space names of a member
    if not label:
        return 'trivial'
    text = ' x '.join(f'{piece}({space})' for space, piece in label)
    return text + (f" per {'x'.join(batch_spaces)}" if batch_spaces else '')
"""


def generate_templated(plan: TemplatePlan, key: str) -> GeneratedCode:
    rest = derive_structure(plan.rest, ids=plan.ids)
    reps = [derive_structure(f.rep, prefix=f"F{k}L") for k, f in enumerate(plan.families)]
    trivial = plan.ids.get(((), ()))
    rest_trivial = next((ib for ib in rest.blocks if not ib.label), None)
    rest_blocks = [ib for ib in rest.blocks if ib.label]
    rest_comps = components_by_block(rest.blocks)
    rest_mult = code(rest_trivial.mult) if rest_trivial is not None else "0"

    src = Source()
    src.add(*header(key, "families of identical layers",
                    ["# Each family of identical layers is a table of names (_F0, ...) and one loop."],
                    ["import json"]))
    read_sizes(src, plan.rest.sizes)
    define_offsets(src, rest.blocks)
    src.add("", "")
    src.helpers(STD_HELPER, NAME_HELPER)

    # member tables, a JSON text per member (strings, which Python compiles far faster than nested
    # tuples: the table of a 1000-layer stack would otherwise be a sixth of the compile)
    for f, (family, rep) in enumerate(zip(plan.families, reps)):
        own = [ib for ib in rep.blocks if ib.label]
        src.add(f"# family {f}: {len(family.params)} members; a row: [parameters, spaces, block ids, size names]",
                f"_F{f} = tuple(json.loads(row) for row in (")
        for m in range(len(family.params)):
            ids = [plan.member_ids(family, m, ib.label, ib.batch_spaces) for ib in own]
            row = json.dumps([family.params[m], family.spaces[m], ids, family.symbols[m]])
            src.add(f"    {row!r},", data=True)
        src.add("))", f"_F{f}_RUN = tuple((p, i, tuple(N[x] for x in z)) for p, s, i, z in _F{f})")
    src.add("", "")

    # BLOCKS: outside blocks as code, each member's blocks from the loop, the trivial block last
    metas = [f"    {block_meta(ib, PIECES)!r}," for ib in rest_blocks]
    src.add(*(["BLOCKS = [", *metas, "]"] if metas else ["BLOCKS = []"]))
    if trivial is not None:
        rows = block_meta(rest_trivial, PIECES)["rows"] if rest_trivial is not None else []
        src.add(f"_TRIVIAL_ROWS = {rows!r}", f"_TRIVIAL_MULT = {rest_mult}")
    for f, (family, rep) in enumerate(zip(plan.families, reps)):
        local = {s: k for k, s in enumerate(family.spaces[0])}
        params = {p.name: j for j, p in enumerate(family.rep.params)}
        src.add(f"for _p, _sp, _ids, _zn in _F{f}:", f"    {_targets(family)} = (N[x] for x in _zn)")
        define_offsets(src, rep.blocks, "    ")
        own = [ib for ib in rep.blocks if ib.label]
        for k, ib in enumerate(own):
            meta = block_meta(ib, PIECES)
            meta["id"] = Code(f"_ids[{k}]")
            meta["label"] = [[Code(f"_sp[{local[s]}]"), piece] for s, piece in ib.label]
            meta["batch_spaces"] = [Code(f"_sp[{local[s]}]") for s in ib.batch_spaces]
            meta["name"] = Code(f"_name({meta['label']!r}, {meta['batch_spaces']!r})")
            meta["dim_expr"] = Code(f"{_positional(str(ib.dim), family)!r}.format(*_zn)")
            for row in meta["rows"]:
                row["param"] = Code(f"_p[{params[row['param']]}]")
            src.add(f"    BLOCKS.append({meta!r})")
        for ib in rep.blocks:
            if not ib.label:
                rows = block_meta(ib, PIECES)["rows"]
                for row in rows:
                    row["param"] = Code(f"_p[{params[row['param']]}]")
                    offset = row["offset"]
                    row["offset"] = Code("_TRIVIAL_MULT" if offset == "0" else f"_TRIVIAL_MULT + {offset}")
                src.add(f"    _TRIVIAL_ROWS += {rows!r}", f"    _TRIVIAL_MULT = _TRIVIAL_MULT + {code(ib.mult)}")
    if trivial is not None:
        src.add(f"BLOCKS.append({{'id': {trivial!r}, 'name': 'trivial', 'label': [], 'batch_spaces': [], "
                "'batch': 1, 'mult': _TRIVIAL_MULT, 'width': 1, 'dim': 1, 'dim_expr': '1', 'rows': _TRIVIAL_ROWS})")
    src.add("BLOCKS.sort(key=lambda b: int(b['id'][1:]))  # the order of the layer-by-layer derivation", "", "")

    # gather
    src.scope = "gather"
    src.add("def gather(t):", '    """{param: tensor} -> {block id: Y (batch, mult, width)}."""')
    ys: dict[str, list[str]] = {ib.id: [] for ib in rest.blocks}
    for i, p in enumerate(plan.rest.params):
        gather_param(src, p, rest_comps, ys, f"t[{p.name!r}]", block_variables(i), PIECES)
    src.add(*(["    out = {", *[f"        {ib.id!r}: {joined(ys[ib.id])},  # d = {ib.dim}" for ib in rest_blocks],
               "    }"] if rest_blocks else ["    out = {}"]))
    if trivial is not None:
        src.add(f"    _triv = [{', '.join(ys[rest_trivial.id]) if rest_trivial is not None else ''}]")
    for f, (family, rep) in enumerate(zip(plan.families, reps)):
        comps = components_by_block(rep.blocks)
        rys: dict[str, list[str]] = {ib.id: [] for ib in rep.blocks}
        src.add(f"    for _p, _ids, {_targets(family, loop=True)} in _F{f}_RUN:")
        for j, p in enumerate(family.rep.params):
            gather_param(src, p, comps, rys, f"t[_p[{j}]]", block_variables(j, f"f{f}b"), PIECES, "        ")
        for k, ib in enumerate(ib for ib in rep.blocks if ib.label):
            src.add(f"        out[_ids[{k}]] = {joined(rys[ib.id])}  # d = {ib.dim}")
        for ib in rep.blocks:
            if not ib.label:
                src.add(f"        _triv += [{', '.join(rys[ib.id])}]")
    if trivial is not None:
        src.add(f"    out[{trivial!r}] = torch.cat(_triv, dim=1)")
    src.add("    return out", "", "")

    # scatter
    scatter_header(src)
    for ib in rest.blocks:
        src.add(f"    z_{ib.id} = z[{ib.id!r}]")
    if trivial is not None:
        src.add(f"    _zt = z[{trivial!r}]", f"    _o = {rest_mult}")
    src.add("    out = {}")
    shared = frozenset({rest_trivial.id} if rest_trivial is not None else ())  # members add rows to it
    for i, p in enumerate(plan.rest.params):
        scatter_param(src, p, rest_comps, block_variables(i), f"out[{p.name!r}]", PIECES, partial=shared)
    for f, (family, rep) in enumerate(zip(plan.families, reps)):
        comps = components_by_block(rep.blocks)
        src.add(f"    for _p, _ids, {_targets(family, loop=True)} in _F{f}_RUN:")
        define_offsets(src, rep.blocks, "        ")
        for k, ib in enumerate(ib for ib in rep.blocks if ib.label):
            src.add(f"        z_{ib.id} = z[_ids[{k}]]")
        for ib in rep.blocks:
            if not ib.label:  # this member's rows of the trivial block, at the running offset
                src.add(f"        z_{ib.id} = _zt[:, _o:_o + {code(ib.mult)}]", f"        _o = _o + {code(ib.mult)}")
        for j, p in enumerate(family.rep.params):
            scatter_param(src, p, comps, block_variables(j, f"f{f}b"), f"out[_p[{j}]]", PIECES, "        ")
    src.add("    return out", "")
    return GeneratedCode(key=key, source=src.text())


def _targets(family: Family, loop: bool = False) -> str:
    """The representative's sizes as assignment targets: `n_h, d_fc1_weight_dim1` (or a parenthesised
    tuple, for a for loop)."""
    names = list(family.local)
    if loop:
        return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"
    return ", ".join(names) + ("," if len(names) == 1 else "")


def _positional(text: str, family: Family) -> str:
    """A dimension's text in the representative's size names, with each name replaced by its position
    ({0}, {1}, ...) so that each member formats it with its own size names."""
    position = {name: k for k, name in enumerate(family.local)}
    return re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: f"{{{position[m[0]]}}}" if m[0] in position else m[0], text)
