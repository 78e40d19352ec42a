"""Scenario contract v2 (DESIGN.md section 4): named sites, paths between two of them, one-line errors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.scenario import ScenarioError, parse_scenario

THREE = """
name = "three"
[transfer]
from = "west"
to = "eu"
[[sites]]
name = "east"
[[sites]]
name = "west"
[[sites]]
name = "eu"
[[paths]]
name = "ew1"
between = ["east", "west"]
rtt_ms = 60
bandwidth_mbps = 400
  [paths.reverse]
  bandwidth_mbps = 100
  loss = 0.01
[[paths]]
name = "ew2"
between = ["west", "east"]
rtt_ms = 70
bandwidth_mbps = 50
[[paths]]
name = "weu"
between = ["west", "eu"]
rtt_ms = 90
bandwidth_mbps = 200
"""


def error_of(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "s.toml")
    message = str(info.value)
    assert "\n" not in message and message.startswith("s.toml: ")
    return message


def test_sites_paths_and_transfer_pair_parse() -> None:
    s = parse_scenario(THREE)
    assert s.sites == ("east", "west", "eu")
    assert [p.between for p in s.paths] == [("east", "west"), ("west", "east"), ("west", "eu")]
    assert s.transfer_pair == ("west", "eu")
    assert [p.name for p in s.paths_between("west", "east")] == ["ew1", "ew2"]
    assert [p.name for p in s.paths_of("eu")] == ["weu"]
    assert s.paths_between("east", "eu") == ()
    assert s.linked_pairs() == ["east-west", "west-eu"]


def test_without_a_transfer_pair_the_first_two_sites_are_used() -> None:
    s = parse_scenario(THREE.replace('from = "west"\nto = "eu"\n', ""))
    assert s.transfer_pair == ("east", "west")


def test_pair_view_orients_every_path_away_from_the_sender() -> None:
    s = parse_scenario(THREE)
    view = s.pair("west", "east")
    assert view.sites == ("west", "east") and view.transfer_pair == ("west", "east")
    ew1, ew2 = view.paths
    # ew1 is written east->west: seen from west, its "reverse" (100 Mb/s, 1% loss) leaves west.
    assert (ew1.between, ew1.forward.bandwidth_mbps, ew1.forward.loss) == (("west", "east"), 100.0, 0.01)
    assert ew1.reverse.bandwidth_mbps == 400.0
    assert ew2 == s.path("ew2")  # already written from west
    assert s.pair("east", "west").path("ew1") == s.path("ew1")


@pytest.mark.parametrize(("src", "dst", "fragment"), [
    ("east", "eu", "no direct path between east and eu; a transfer runs over the paths joining its two "
     "sites (pairs with paths: east-west, west-eu)"),
    ("east", "east", "a transfer needs two different sites, got 'east' twice"),
    ("mars", "east", "unknown site 'mars'; sites: east, west, eu"),
])
def test_pair_view_errors_are_one_line(src: str, dst: str, fragment: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(THREE, "s.toml").pair(src, dst)
    assert str(info.value) == f"s.toml: {fragment}"


def test_v1_file_has_sites_a_and_b_and_its_pair_view_is_itself() -> None:
    v1 = parse_scenario('name = "v1"\n[[paths]]\nname = "p"\nrtt_ms = 10\nbandwidth_mbps = 5\n')
    assert v1.sites == ("a", "b") and v1.paths[0].between == ("a", "b")
    assert v1.transfer_pair == ("a", "b")
    assert v1.pair("a", "b") is v1
    assert v1.pair("b", "a").paths[0].between == ("b", "a")


SITES = '[[sites]]\nname = "x"\n[[sites]]\nname = "y"\n'
PATH_XY = '[[paths]]\nname = "p"\nbetween = ["x", "y"]\nrtt_ms = 10\nbandwidth_mbps = 5\n'


@pytest.mark.parametrize(("text", "expected"), [
    (SITES + '[[sites]]\nname = "x"\n' + PATH_XY,
     "sites[2].name: duplicate site name 'x' (also sites[0]); a name unique among the sites"),
    ('[[sites]]\nname = "x"\n' + PATH_XY, "sites: 1 sites; between 2 and 16 [[sites]] tables"),
    ("".join(f'[[sites]]\nname = "s{i}"\n' for i in range(17)) + PATH_XY,
     "sites: 17 sites; between 2 and 16 [[sites]] tables"),
    ('sites = ["x", "y"]\n' + PATH_XY, "sites[0]: expected a table, got 'x' (string); a TOML table"),
    ('[[sites]]\nname = "x"\n[[sites]]\nplace = "y"\n' + PATH_XY,
     "sites[1].place: unknown key; valid keys here: name"),
    ('[[sites]]\nname = "x"\n[[sites]]\n' + PATH_XY,
     'sites[1].name: missing required field; a site name, e.g. name = "east"'),
    (SITES + '[[sites]]\nname = "bad name"\n' + PATH_XY, "sites[2].name: invalid name 'bad name'"),
    (SITES + PATH_XY.replace('"y"]', '"z"]'),
     "paths[0].between[1]: unknown site 'z'; one of the [[sites]]: x, y"),
    (SITES + PATH_XY.replace('"y"]', '"x"]'),
     "paths[0].between: a path between site 'x' and itself; two different site names"),
    (SITES + PATH_XY.replace('["x", "y"]', '["x"]'),
     "paths[0].between: expected an array of two site names, got ['x'] (array)"),
    (SITES + PATH_XY.replace('["x", "y"]', '"x-y"'), "paths[0].between: expected an array of two site names"),
    (SITES + PATH_XY.replace('between = ["x", "y"]\n', ""),
     "paths[0].between: missing required field; the two sites the path joins"),
    (SITES + '[[sites]]\nname = "z"\n' + PATH_XY,
     "sites[2]: site 'z' has no paths; every site needs at least one [[paths]] table naming it in between"),
    (PATH_XY, "paths[0].between: ['x', 'y'] in a file without [[sites]]; declare [[sites]] tables"),
    (SITES + PATH_XY + '[transfer]\nfrom = "x"\n',
     "transfer.to: missing required field; give both from and to"),
    (SITES + PATH_XY + '[transfer]\nfrom = "x"\nto = "w"\n',
     "transfer.to: unknown site 'w'; one of the sites: x, y"),
    (SITES + PATH_XY + '[transfer]\nfrom = "y"\nto = "y"\n',
     "transfer.to: a transfer from site 'y' to itself"),
    ('[[paths]]\nname = "p"\nrtt_ms = 1\nbandwidth_mbps = 1\n[transfer]\nfrom = "a"\nto = "c"\n',
     "transfer.to: unknown site 'c'; one of the sites: a, b"),
    (SITES + PATH_XY + PATH_XY.replace('"p"', '"p"'), "paths[1].name: duplicate path name 'p'"),
])
def test_v2_errors(text: str, expected: str) -> None:
    assert expected in error_of('name = "n"\n' + text)


def test_a_v1_path_may_spell_out_its_default_sites() -> None:
    s = parse_scenario('name = "n"\n[[paths]]\nname = "p"\nbetween = ["a", "b"]\n'
                       "rtt_ms = 1\nbandwidth_mbps = 1\n")
    assert s.sites == ("a", "b") and s.paths[0].between == ("a", "b")


def _mesh_text(sites: list[str], links: list[tuple[int, int]]) -> str:
    text = 'name = "m"\n' + "".join(f'[[sites]]\nname = "{s}"\n' for s in sites)
    for k, (i, j) in enumerate(links):
        text += (f'[[paths]]\nname = "p{k}"\nbetween = ["{sites[i]}", "{sites[j]}"]\n'
                 f"rtt_ms = {10 + k}\nbandwidth_mbps = {1 + k}\n")
    return text


@st.composite
def meshes(draw: st.DrawFn) -> tuple[list[str], list[tuple[int, int]]]:
    n = draw(st.integers(2, 16))
    sites = draw(st.lists(st.from_regex(r"[a-z][a-z0-9_-]{0,7}", fullmatch=True), min_size=n, max_size=n,
                          unique=True))
    links = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40))
    return sites, links


@settings(max_examples=60)
@given(meshes())
def test_any_mesh_parses_or_names_its_first_problem(mesh: tuple[list[str], list[tuple[int, int]]]) -> None:
    sites, links = mesh
    text = _mesh_text(sites, links)
    self_loop = next((k for k, (i, j) in enumerate(links) if i == j), None)
    lonely = next((i for i in range(len(sites)) if all(i not in link for link in links)), None)
    if self_loop is not None:
        assert f"paths[{self_loop}].between: a path between site" in error_of(text)
    elif not links:
        assert "paths: missing required field; at least one [[paths]] table" in error_of(text)
    elif lonely is not None:
        assert f"sites[{lonely}]: site {sites[lonely]!r} has no paths" in error_of(text)
    else:
        s = parse_scenario(text)
        assert s.sites == tuple(sites)
        assert [p.between for p in s.paths] == [(sites[i], sites[j]) for i, j in links]
        for k, (i, j) in enumerate(links):
            view = s.pair(sites[j], sites[i])
            assert f"p{k}" in [p.name for p in view.paths]
            assert all(p.between == (sites[j], sites[i]) for p in view.paths)
