"""What drawing a case costs: templates from Hypothesis, runtime variations and launch partners
from seeded choices, and the plan of a campaign at the GPU's and the CPU's default settings.

    python benchmarks/bench_drawing.py [--templates 16] [--per-template 32] [--seed 0]

Figures, in ms per case of this process's CPU time: a template (``strategies.cases`` through
Hypothesis, and the same builder, ``template_case``, from seeded choices); a runtime variation
and a launch partner of each template, both from
:class:`~difftest.generation.choices.SeededChoices` (what campaigns use) and from the same
builders' Hypothesis strategies (``runtime_variations``, ``launch_partners``: what campaigns used
before); then a campaign's planned cases (:func:`~difftest.campaign.planning.planned_cases`, the
paths' support checks included) at the GPU defaults (32 cases per variant, 8 per launch, GPU
limits), at the CPU defaults (a template per case, one in ``CPU_HYPOTHESIS_EVERY`` from
Hypothesis) and with every CPU template from Hypothesis (the CPU default before). No assertion on speed: for reading.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time
from collections.abc import Callable

from difftest.campaign.planning import CPU_HYPOTHESIS_EVERY, CampaignConfig, planned_cases
from difftest.generation.choices import SeededChoices, sample_distinct
from difftest.generation.sampling import sample_cases
from difftest.generation.strategies import (
    CPU_LIMITS,
    GPU_LIMITS,
    cases,
    launch_partners,
    partner_case,
    runtime_variations,
    template_case,
    variation_case,
)
from difftest.model.case import Case


def per_case(run: Callable[[], int]) -> tuple[float, int]:
    """(ms of CPU time per case, cases) of ``run``, which returns how many it made."""
    start = time.process_time()
    n = run()
    return (time.process_time() - start) * 1e3 / max(1, n), n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--templates", type=int, default=16)
    p.add_argument("--per-template", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    k = args.per_template
    for name, limits in (("cpu limits", CPU_LIMITS), ("gpu limits", GPU_LIMITS)):
        templates: list[Case] = []

        def draw_templates(lim=limits, out=templates) -> int:  # type: ignore[no-untyped-def]
            out += sample_cases(cases(limits=lim), seed=args.seed, count=args.templates)
            return len(out)

        ms, n = per_case(draw_templates)
        print(f"{name}: template (Hypothesis)              {ms:7.3f} ms/case  ({n} cases)")
        choices = SeededChoices(args.seed)
        ms, n = per_case(
            lambda ch=choices, lim=limits: len([template_case(ch, limits=lim) for _ in range(400)])
        )
        print(f"{name}: template (seeded)                  {ms:7.3f} ms/case  ({n} cases)")
        for label, builder, strategy in (
            ("runtime variation", variation_case, runtime_variations),
            ("launch partner   ", partner_case, launch_partners),
        ):
            seeded, n1 = per_case(
                lambda b=builder, lim=limits: sum(
                    len(sample_distinct(functools.partial(b, template=t, limits=lim),
                                        Case.digest, seed=i, count=k))
                    for i, t in enumerate(templates)
                )
            )  # fmt: skip
            drawn, n2 = per_case(
                lambda s=strategy, lim=limits: sum(
                    len(sample_cases(s(t, lim), seed=i, count=k)) for i, t in enumerate(templates)
                )
            )
            print(
                f"{name}: {label} seeded {seeded:7.3f} ms/case ({n1}), Hypothesis "
                f"{drawn:7.3f} ms/case ({n2}): {drawn / seeded:5.1f}x"
            )
    for name, config in (
        ("gpu defaults (32 per variant, 8 per launch)",
         CampaignConfig(seed=args.seed, cases_per_variant=32, pack=8, limits=GPU_LIMITS)),
        (f"cpu defaults (a template per case, 1 in {CPU_HYPOTHESIS_EVERY} from Hypothesis)",
         CampaignConfig(seed=args.seed)),
        ("cpu, every template from Hypothesis",
         CampaignConfig(seed=args.seed, hypothesis_every=1)),
    ):  # fmt: skip
        ms, n = per_case(
            lambda c=config: sum(1 for _ in itertools.islice(planned_cases(c, "cpu"), 2000))
        )
        print(f"campaign plan, {name}: {ms:7.3f} ms/case ({n} cases)")


if __name__ == "__main__":
    main()
