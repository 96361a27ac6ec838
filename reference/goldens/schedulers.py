"""Goldens for FlowMatchEulerDiscreteScheduler: timesteps and sigmas as the pipelines set them.

Writes tests/fixtures/schedulers/cases.json (each case's config and call) and
tests/fixtures/schedulers/schedules.safetensors (<case>.timesteps, <case>.sigmas, float32).
"""
import json

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

from goldens._common import save

CONFIGS = {
    # Published scheduler configs (FLUX.1-schnell, FLUX.1-dev, SD3.5, FLUX.2-dev style).
    "schnell": dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False),
    "dev": dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096),
    "sd35": dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False),
    "flux2": dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                  time_shift_type="exponential"),
    "terminal": dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True,
                     shift_terminal=0.1, time_shift_type="linear"),
}


def _case(name, cfg, steps, mode, seq_len):
    sched = FlowMatchEulerDiscreteScheduler(**cfg)
    call = {"steps": steps}
    if mode == "flux":  # FluxPipeline: float64 linspace sigmas + calculate_shift mu
        sigmas = np.linspace(1.0, 1 / steps, steps)
        mu = calculate_shift(seq_len, sched.config.get("base_image_seq_len", 256),
                             sched.config.get("max_image_seq_len", 4096),
                             sched.config.get("base_shift", 0.5),
                             sched.config.get("max_shift", 1.15))
        sched.set_timesteps(steps, sigmas=sigmas, mu=mu)
        call.update(sigmas="linspace", mu=mu, image_seq_len=seq_len)
    elif mode == "flux2":  # Flux2Pipeline: linspace sigmas + empirical mu
        sigmas = np.linspace(1.0, 1 / steps, steps)
        mu = compute_empirical_mu(seq_len, steps)
        sched.set_timesteps(steps, sigmas=sigmas, mu=mu)
        call.update(sigmas="linspace", mu=mu, image_seq_len=seq_len)
    else:  # SD3 pipeline with a static shift: no sigmas, no mu
        sched.set_timesteps(steps)
        call.update(sigmas=None, mu=None)
    return {"config": cfg, "call": call}, sched.timesteps.to(torch.float32), sched.sigmas


def make(fixtures):
    cases, tensors = {}, {}
    plan = [("schnell", "flux"), ("dev", "flux"), ("sd35", "none"), ("flux2", "flux2"),
            ("terminal", "flux")]
    for cfg_name, mode in plan:
        for steps in (1, 2, 4, 8, 28, 50):
            for seq_len in ((16, 1024, 4096, 6000) if mode != "none" else (0,)):
                name = f"{cfg_name}_s{steps}_l{seq_len}"
                case, t, s = _case(name, CONFIGS[cfg_name], steps, mode, seq_len)
                cases[name] = case
                tensors[f"{name}.timesteps"] = t
                tensors[f"{name}.sigmas"] = s
    out = fixtures / "schedulers"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cases.json").write_text(json.dumps(cases, indent=1, sort_keys=True) + "\n")
    save(out / "schedules.safetensors", tensors)
