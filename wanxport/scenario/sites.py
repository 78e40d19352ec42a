"""Contract v2's sites (DESIGN.md section 4): the ``[[sites]]`` tables and how paths join them.

Why a module of its own: whether a path's ends, a transfer's ends and the
site list agree can only be checked once the whole file is read (``[[sites]]``
may come after ``[[paths]]`` in TOML), so the parser validates each table on
its own and then asks ``check_mesh`` about the whole. Errors are ``Invalid``
with the field path of the first offending value.
"""

from __future__ import annotations

from collections.abc import Sequence

from wanxport.scenario.model import MAX_SITES, V1_SITES, PathSpec, Transfer
from wanxport.scenario.validators import Invalid, describe, fields, name, table

_SITE_FIELDS = {"name": name}


def sites(value: object, path: str) -> tuple[str, ...]:
    """``[[sites]]``: 2..MAX_SITES tables, each with a unique ``name``."""
    if not isinstance(value, list):
        raise Invalid(path, f"expected an array of tables, got {describe(value)}",
                      '[[sites]] tables, each with name = "..."')
    if not 2 <= len(value) <= MAX_SITES:
        raise Invalid(path, f"{len(value)} sites", f"between 2 and {MAX_SITES} [[sites]] tables")
    names: list[str] = []
    for i, item in enumerate(value):
        where = f"{path}[{i}]"
        site = fields(table(item, where), where, _SITE_FIELDS, required=("name",),
                      hints={"name": 'a site name, e.g. name = "east"'})["name"]
        if site in names:
            raise Invalid(f"{where}.name", f"duplicate site name {site!r} (also sites[{names.index(site)}])",
                          "a name unique among the sites")
        names.append(site)
    return tuple(names)


def site_pair(value: object, path: str) -> tuple[str, str]:
    """A path's ``between``: two different site names."""
    valid = 'two different site names, e.g. between = ["east", "west"]'
    if not isinstance(value, list) or len(value) != 2:
        raise Invalid(path, f"expected an array of two site names, got {describe(value)}", valid)
    one, other = (name(item, f"{path}[{i}]") for i, item in enumerate(value))
    if one == other:
        raise Invalid(path, f"a path between site {one!r} and itself", valid)
    return (one, other)


def check_mesh(site_names: tuple[str, ...] | None, paths: Sequence[PathSpec],
               transfer: Transfer | None, written: Sequence[object]) -> None:
    """The paths' and the transfer's sites are declared sites, and every site has a path.

    ``site_names`` is None for a v1 file: its sites are ``a`` and ``b`` and
    every path joins them (``between``, if written, must say so). ``written``
    holds the ``[[paths]]`` tables as read, to tell a missing ``between`` from
    a v1 default.
    """
    if site_names is None:
        for i, spec in enumerate(paths):
            if spec.between != V1_SITES:
                raise Invalid(f"paths[{i}].between", f"{list(spec.between)} in a file without [[sites]]",
                              'declare [[sites]] tables, or leave between out (sites "a" and "b")')
        known: tuple[str, ...] = V1_SITES
    else:
        known = site_names
        for i, raw in enumerate(written):
            if isinstance(raw, dict) and "between" not in raw:
                raise Invalid(f"paths[{i}].between", "missing required field",
                              'the two sites the path joins, e.g. between = ["east", "west"]')
        for i, spec in enumerate(paths):
            for end, site in enumerate(spec.between):
                if site not in known:
                    raise Invalid(f"paths[{i}].between[{end}]", f"unknown site {site!r}",
                                  f"one of the [[sites]]: {', '.join(known)}")
        touched = {site for spec in paths for site in spec.between}
        for i, site in enumerate(known):
            if site not in touched:
                raise Invalid(f"sites[{i}]", f"site {site!r} has no paths",
                              "every site needs at least one [[paths]] table naming it in between")
    if transfer is not None and transfer.from_site is not None:
        for key, named in (("from", transfer.from_site), ("to", transfer.to_site)):
            if named not in known:
                raise Invalid(f"transfer.{key}", f"unknown site {named!r}",
                              f"one of the sites: {', '.join(known)}")
        if transfer.from_site == transfer.to_site:
            raise Invalid("transfer.to", f"a transfer from site {transfer.from_site!r} to itself",
                          "two different sites")
