"""The run's configuration seen from one of its sections: fairseq builds a task or model from its own section
(``cfg.task``, ``cfg.model``), whose parent is the whole run (common, checkpoint, criterion, ...); and a value
written on hydra's command line."""
import re

from omegaconf import OmegaConf


def run_section(cfg, name: str):
    """Section ``name`` of the run ``cfg`` belongs to, or None (a config built outside a run, or no such section)."""
    run = cfg._get_parent() if OmegaConf.is_config(cfg) else None
    section = run.get(name) if OmegaConf.is_dict(run) else None
    return section if OmegaConf.is_dict(section) else None


def hydra_override(key: str, value) -> str:
    """``key=value`` for a hydra command line, the value quoted so that hydra reads back exactly ``str(value)``, as
    fairseq quotes the options it converts: a path with a comma, a bracket, a quote, an ``=`` or ``${`` would
    otherwise be read as a list, a syntax error or an interpolation. Inside hydra's quotes a backslash escapes a
    quote, ``${`` or the closing quote only, so only the backslashes in front of those are doubled."""
    text = re.sub(r"(\\*)'", lambda m: m[1] * 2 + "\\'", str(value))
    text = re.sub(r"(\\*)\$\{", lambda m: m[1] * 2 + "\\${", text)
    text = re.sub(r"(\\+)$", lambda m: m[1] * 2, text)
    return f"{key}='{text}'"
