"""Small experiment configurations shared by the tests (TOML text; no spherepde import, so that the
results-file reader test can use it without the package)."""


def zero_temperature_run(name: str, nside: int = 2, means: str = "[[1, 0.2, 0.1]]", kappas: float = 2.0,
                         uniform_weight: float = 0.5, t_end: float = 0.5, save_every: float = 0.25,
                         tail: str = "") -> str:
    """A zero-temperature run (paper matrices) from a vMF mixture on HEALPix; ``tail``: more sections."""
    return f"""
name = "{name}"
[grid]
type = "healpix"
nside = {nside}
[model]
type = "zero_temperature"
B = "paper"
V = "paper"
[initial]
type = "vmf_mixture"
means = {means}
kappas = {kappas}
uniform_weight = {uniform_weight}
[time]
t_end = {t_end}
save_every = {save_every}
""" + tail
