"""Experiment configuration: parsing, defaults, and the promised errors (key, value, what is allowed)."""
from pathlib import Path

import numpy as np
import pytest

from spherepde.config import ConfigError, dump_toml, load_config, parse_config, vmf_density
from spherepde.solver import Options

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"

BASE = """
name = "t"
[grid]
type = "healpix"
nside = 2
[model]
type = "zero_temperature"
B = "paper"
V = "paper"
[time]
t_end = 1.0
"""


def cfg_with(extra: str = "", base: str = BASE):
    return parse_config(base + extra)


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return info.value


def test_minimal_config_defaults():
    c = cfg_with()
    assert c.grid.nside == 2 and c.grid.dim == 3
    np.testing.assert_array_equal(c.model.B, np.diag([-1.0, -1.0, 1.0]))
    np.testing.assert_array_equal(c.model.V, np.diag([-1.0, 1.0, -2.0]))
    assert c.initial.type == "uniform"
    np.testing.assert_array_equal(c.save_times(), [0.0, 1.0])
    assert c.options() == Options(field_time="exact")  # (SchemeConfig: the one default that differs)
    assert c.particles is None


def test_scheme_maps_to_options():
    c = cfg_with('[scheme]\nscheme = "upwind"\nstepper = "ssprk3"\ncfl = 0.25\nfield_interval = 3\n'
                 'field_time = "interpolate"\n')
    assert c.options() == Options(scheme="upwind", stepper="ssprk3", cfl=0.25, field_interval=3,
                                  field_time="interpolate")
    assert "field_time" in str(error_of(BASE + '[scheme]\nfield_time = "linear"\n'))
    # the one default that differs from Options': it acts on no configured model (next test), and keeps the
    # JSON of configurations of earlier versions, which names their checkpoints and sweep members
    assert cfg_with().options().field_time == "exact" and Options().field_time == "auto"


def test_save_every_includes_end_and_save_at():
    c = parse_config(BASE.replace("t_end = 1.0", "t_end = 1.0\nsave_every = 0.3"))
    np.testing.assert_allclose(c.save_times(), [0.0, 0.3, 0.6, 0.9, 1.0])
    c = parse_config(BASE.replace("t_end = 1.0", "t_end = 1.0\nsave_every = 0.25"))
    np.testing.assert_allclose(c.save_times(), [0.0, 0.25, 0.5, 0.75, 1.0])
    c = parse_config(BASE.replace("t_end = 1.0", "t_end = 1.0\nsave_at = [0, 0.5]"))
    np.testing.assert_array_equal(c.save_times(), [0.0, 0.5])


def test_matrices_nested_diagonal_and_preset_agree():
    a = cfg_with().model
    b = parse_config(BASE.replace('B = "paper"', "B = [-1, -1, 1]")).model
    c = parse_config(BASE.replace('B = "paper"', "B = [[-1, 0, 0], [0, -1, 0], [0, 0, 1]]")).model
    assert a.B == b.B == c.B


@pytest.mark.parametrize("text, key, fragment", [
    (BASE + "[grid2]\nx = 1\n", "grid2", "unknown key"),
    (BASE.replace("nside = 2", "nside = 2\nnsidee = 3"), "grid.nsidee", "unknown key"),
    (BASE + "[scheme]\nlimitr = \"none\"\n", "scheme.limitr", "unknown key"),
    (BASE.replace("nside = 2", 'nside = "two"'), "grid.nside", "an integer >= 1"),
    (BASE.replace("nside = 2", "nside = 0"), "grid.nside", "an integer >= 1"),
    (BASE.replace("nside = 2", "nside = 2.5"), "grid.nside", "an integer"),
    (BASE + "[scheme]\ncfl = 1.5\n", "scheme.cfl", "<= 1.0"),
    (BASE + "[scheme]\ncfl = \"big\"\n", "scheme.cfl", "a finite number"),
    (BASE + "[scheme]\nstepper = \"rk45\"\n", "scheme.stepper", "'ssprk2'"),
    (BASE.replace("t_end = 1.0", "t_end = -1.0"), "time.t_end", ">= 0.0"),
    (BASE.replace("t_end = 1.0", "t_end = 1.0\nsave_at = [0.5, 0.2]"), "time.save_at", "strictly increasing"),
    (BASE.replace("t_end = 1.0", "t_end = 1.0\nsave_at = [0, 2]"), "time.save_at", "in [0, 1.0]"),
    (BASE.replace('B = "paper"', 'B = "papr"'), "model.B", "'paper'"),
    (BASE.replace('B = "paper"', "B = [[1, 2], [3]]"), "model.B", "square"),
    (BASE.replace('B = "paper"', "B = [1, 1]"), "model.V", "2 x 2"),
    (BASE.replace('B = "paper"', "B = [[1, 1, 0], [1, 1, 0], [0, 0, 1]]"), "model.B", "invertible"),
    (BASE.replace('"zero_temperature"', '"attention"'), "model.beta", "required"),
    (BASE.replace('"zero_temperature"', '"attention"') + "", "model.beta", "a number"),
    (BASE.replace('V = "paper"', 'V = "paper"\nbeta = -1.0').replace('"zero_temperature"', '"attention"'),
     "model.beta", ">= 0.0"),
    (BASE.replace('"zero_temperature"', '"hot"'), "model.type", "'attention'"),
    (BASE + "[output]\nplots = [\"maps\", \"movie\"]\n", "output.plots", "'animation'"),
    (BASE + "[output]\nfits = 1\n", "output.fits", "true or false"),
    (BASE + "[initial]\ntype = \"vmf_mixture\"\nmeans = [[1, 0]]\nkappas = 1.0\n", "initial.means", "length 3"),
    (BASE + "[initial]\ntype = \"vmf_mixture\"\nmeans = [[1, 0, 0]]\nkappas = -1.0\n", "initial.kappas", ">= 0"),
    (BASE + "[initial]\ntype = \"expression\"\n", "initial.type", "'vmf_mixture'"),
    (BASE + "[particles]\nn = 0\n", "particles.n", ">= 1"),
    (BASE.replace("[time]\nt_end = 1.0\n", ""), "time", "required"),
])
def test_bad_configs_name_key_and_allowed(text, key, fragment):
    err = error_of(text)
    assert err.key == key
    msg = str(err)
    assert f"'{key}'" in msg and fragment in msg, msg
    assert "got" in msg and "allowed" in msg


def test_bad_toml_syntax():
    err = error_of("[grid\n")
    assert err.key == "<toml>" and "valid TOML" in str(err)


def test_dump_toml_round_trip():
    c = cfg_with('[initial]\ntype = "vmf_mixture"\nmeans = [[1, 0, 0], [0, 0, -1]]\nkappas = [2.0, 5]\n'
                 '[particles]\nn = 10\n[output]\nplots = ["maps"]\n')
    d = parse_config(dump_toml(c.raw))
    assert d == c
    e = parse_config(c.to_dict())  # the validated dict, defaults filled in, parses to the same
    assert e == c
    u = cfg_with()
    assert parse_config(u.to_dict()) == u


def test_vmf_mixture_is_a_probability_density():
    from spherepde.grids.healpix import HealpixGrid

    c = cfg_with('[initial]\ntype = "vmf_mixture"\nmeans = [[1, 0, 0], [0, 1, 1]]\nkappas = [4.0, 20.0]\n'
                 'weights = [1, 3]\nuniform_weight = 0.2\n')
    g = HealpixGrid(8)
    f = c.build_initial(g)
    assert abs(g.mass(f) - 1.0) < 1e-3
    assert f.min() >= 0.2 / (4 * np.pi) * (1 - 1e-12)
    # vMF normalisation in d = 3 against the closed form kappa / (4 pi sinh kappa) e^{kappa <mu, x>}
    x = np.array([[1.0, 0, 0], [0, 1.0, 0], [-1.0, 0, 0]])
    k = 3.0
    np.testing.assert_allclose(vmf_density(x, [1, 0, 0], k), k / (4 * np.pi * np.sinh(k)) * np.exp(k * x[:, 0]),
                               rtol=1e-12)


def test_load_missing_file():
    with pytest.raises(FileNotFoundError):
        load_config("/nonexistent/experiment.toml")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_documented_examples_parse(path):
    c = load_config(path)
    assert c.time.t_end >= 0
    c.build_model()


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_no_configured_model_is_a_time_dependent_pointwise_field(path):
    """The premise on which ``[scheme] field_time`` keeps the default of earlier versions ("exact", where
    ``Options`` has "auto"; ``SchemeConfig``): the option acts only where the model in force is local and
    time-dependent, given point-wise, and no configured model is; on every documented example, and on a
    configuration of layers of prescribed fields (the one way a configured local field changes in time), at
    every layer start."""
    from spherepde.models import terms

    layered = BASE.replace('type = "zero_temperature"\nB = "paper"\nV = "paper"',
                           'type = "layers"\n[[model.layers]]\nt_start = 0.0\ntype = "prescribed_rotation"\n'
                           'axis = [0, 0, 1]\nomega = 1.0\n[[model.layers]]\nt_start = 0.5\n'
                           'type = "prescribed_linear"\nM = [[0, 1, 0], [-1, 0, 0], [0, 0, 0.5]]')
    for cfg in (load_config(path), parse_config(layered)):
        model = cfg.build_model()
        for t in (0.0,) + terms.boundaries(model):
            active = terms.resolve(model, t)
            assert not active.local or active.steady, (cfg.name, t, active)


def test_beta_inf_is_the_zero_temperature_limit():
    """A beta scan may include inf: the config builds ZeroTemperature (and checks B is invertible)."""
    from spherepde.models import ZeroTemperature

    cfg = cfg_with(BASE.replace('type = "zero_temperature"', 'type = "attention"\nbeta = inf'), base="")
    m = cfg.build_model()
    assert isinstance(m, ZeroTemperature)
    np.testing.assert_array_equal(m.B, np.diag([-1.0, -1.0, 1.0]))
    with pytest.raises(ConfigError) as e:
        parse_config({"grid": {"type": "healpix", "nside": 2}, "time": {"t_end": 1.0},
                      "model": {"type": "attention", "B": [1.0, 1.0, 0.0], "V": "paper", "beta": float("inf")}})
    assert e.value.key == "model.B" and "beta = inf" in str(e.value)
    with pytest.raises(ConfigError):  # -inf is no beta
        parse_config({"grid": {"type": "healpix", "nside": 2}, "time": {"t_end": 1.0},
                      "model": {"type": "attention", "B": "paper", "V": "paper", "beta": float("-inf")}})


def test_field_interval_zero_is_every_stage():
    raw = {"grid": {"type": "healpix", "nside": 2}, "time": {"t_end": 1.0},
           "model": {"type": "zero_temperature", "B": "paper", "V": "paper"}, "scheme": {"field_interval": 0}}
    assert parse_config(raw).options().field_interval is None
    assert parse_config(raw).to_json() == parse_config({k: v for k, v in raw.items() if k != "scheme"}).to_json()
    raw["scheme"]["field_interval"] = -1
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert e.value.key == "scheme.field_interval"


def _zt8(initial: dict) -> dict:
    """A zero-temperature run on HEALPix nside 8 with the given [initial] table (a raw config dict)."""
    return {"grid": {"type": "healpix", "nside": 8}, "time": {"t_end": 1.0},
            "model": {"type": "zero_temperature", "B": "paper", "V": "paper"}, "initial": initial}


def test_perturbed_uniform_initial_density():
    from spherepde.grids import HealpixGrid

    raw = _zt8({"type": "perturbed_uniform"})
    g = HealpixGrid(8)
    avg = parse_config(raw).build_initial(g)
    raw["initial"]["sample"] = "center"
    ctr = parse_config(raw).build_initial(g)
    x = g.centers  # the studies' historical formula, written out: the centre sample reproduces it exactly
    np.testing.assert_array_equal(ctr, (1.0 + 0.05 * (x[:, 0] * x[:, 1] + x[:, 1] + 0.5 * x[:, 2] * x[:, 0]))
                                  / (4 * np.pi))
    # the perturbation integrates to 0 exactly (odd terms), so the cell averages carry mass 1 to the
    # quadrature's rounding; centre values only to O(h^2)
    assert abs(avg @ g.areas - 1.0) < 1e-13
    assert 1e-13 < np.abs(avg - ctr).max() < 1e-2 / 8**2 * 10
    raw["initial"]["eps"] = 0.7  # > 2/3: the density could be negative
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert e.value.key == "initial.eps"
    raw["initial"] = {"type": "uniform", "eps": 0.1}
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert e.value.key == "initial.eps"


def test_quadratic_initial_density_is_normalised_and_checked():
    from spherepde.grids import HealpixGrid, TensorGrid

    raw = _zt8({"type": "quadratic", "Q": [[0.0, 0.15, 0.0], [0.15, 0.0, 0.0], [0.0, 0.0, 0.0]]})
    g = HealpixGrid(8)
    x = g.centers
    cfg = parse_config(raw)
    # the minimal-density study's f0 = (1 + 0.3 x1 x2) / (4 pi), to rounding
    np.testing.assert_allclose(cfg.initial.density(3)(x), (1 + 0.3 * x[:, 0] * x[:, 1]) / (4 * np.pi), rtol=1e-15)
    # a trace and a linear part: still mass 1 (the -tr(Q)/d term), to the grid quadrature's accuracy
    raw["initial"] = {"type": "quadratic", "Q": [0.2, -0.1, 0.3], "b": [0.1, 0.0, -0.2]}
    f = parse_config(raw).build_initial(g)
    assert abs(f @ g.areas - 1.0) < 1e-12 and f.min() > 0
    # S^1 (d = 2): (1 + x^T Q x - tr Q / 2) / (2 pi) integrates to 1 as well
    t = TensorGrid(2, 64)
    raw2 = {"grid": {"type": "tensor", "d": 2, "n": 64}, "time": {"t_end": 1.0},
            "model": {"type": "zero_temperature", "B": [1.0, 1.0], "V": [1.0, -1.0]},
            "initial": {"type": "quadratic", "Q": [[0.3, 0.1], [0.1, -0.2]]}}
    assert abs(parse_config(raw2).build_initial(t) @ t.areas - 1.0) < 1e-12
    for bad, key in ((dict(Q=[[0.0, 1.2, 0.0], [1.2, 0.0, 0.0], [0.0, 0.0, 0.0]]), "initial.Q"),  # not positive
                     (dict(Q=[[1.0, 0.0], [0.0, 1.0]]), "initial.Q"),                               # wrong size
                     (dict(b=[0.1, 0.2]), "initial.b"), (dict(b="x"), "initial.b")):
        raw["initial"] = {"type": "quadratic", **bad}
        with pytest.raises(ConfigError) as e:
            parse_config(raw)
        assert e.value.key == key, (bad, str(e.value))
