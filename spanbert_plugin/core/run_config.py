"""The run's configuration seen from one of its sections: fairseq builds a task or model from its own section
(``cfg.task``, ``cfg.model``), whose parent is the whole run (common, checkpoint, criterion, ...)."""
from omegaconf import OmegaConf


def run_section(cfg, name: str):
    """Section ``name`` of the run ``cfg`` belongs to, or None (a config built outside a run, or no such section)."""
    run = cfg._get_parent() if OmegaConf.is_config(cfg) else None
    section = run.get(name) if OmegaConf.is_dict(run) else None
    return section if OmegaConf.is_dict(section) else None
