"""Keeping what a campaign finds: every finding of a judged launch is triaged into its group
(triage's rechecks of one launch run together where they can), appended to
``findings.jsonl`` and to the report's tally as it is found, and every group's representative
repro is written as soon as the group exists and rewritten once shrunk
(:mod:`difftest.records.run_dir`), so a killed campaign loses nothing. A finding only a packed
launch shows is kept with its whole launch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from difftest.campaign.planning import CampaignConfig
from difftest.campaign.report import FindingRecord, Tally, variant_name
from difftest.execution.launches import Judged
from difftest.execution.session import Session
from difftest.judgement.signature import Signature, signature_of
from difftest.machine.environment import stamp
from difftest.model.case import Case
from difftest.model.outcome import CaseResult, Finding, PathResult
from difftest.records.repro import PACKED_ENDING, Repro, finding_stem, write_repro
from difftest.records.run_dir import LoggedFinding, RunDirectory
from difftest.reduction.report import ShrinkReport
from difftest.triage.groups import Group, Member, Triage
from difftest.triage.packed_only import likely_known


@dataclass(slots=True)
class Keeper:
    """Triages, logs and writes the findings of a campaign's judged launches."""

    config: CampaignConfig
    session: Session
    out: RunDirectory
    triage: Triage
    tally: Tally
    rechecked: dict[tuple[str, Signature], bool | None] = field(default_factory=dict)
    """The answers :meth:`recheck_ahead` got for the launch being kept, by (case digest,
    signature)."""

    # -- running cases ------------------------------------------------------------------------

    def recheck(self, case: Case, signature: Signature) -> bool | None:
        """Whether ``case`` still fails with ``signature`` on its path (triage's one rerun):
        the answer :meth:`recheck_ahead` got for it, else one rerun now."""
        key = (case.digest(), signature)
        if key in self.rechecked:
            return self.rechecked.pop(key)
        clock, compiled = time.perf_counter(), self.session.recheck_compile_s
        try:
            return self.session.still_fails(case, signature)
        finally:
            self._rechecked_for(time.perf_counter() - clock, compiled)

    def _rechecked_for(self, seconds: float, compiled_before: float) -> None:
        """Count ``seconds`` of rechecks as triage, less what their first launches of a
        compile variant spent in the kernels (module builds and loads: compile, as a
        launch's first run of a variant is counted)."""
        compiled = self.session.recheck_compile_s - compiled_before
        self.tally.timings["compile"] += compiled
        self.tally.timings["triage"] += max(0.0, seconds - compiled)

    def recheck_ahead(self, judged: Sequence[Judged]) -> None:
        """Run the rechecks that triage will ask for the findings of one launch, together
        (:meth:`Session.still_fail`: in launches of up to the campaign's packing), and keep
        their answers for :meth:`recheck`. Two or more are needed to gain anything; a
        recheck triage asks only later (a group established meanwhile) runs then, alone."""
        wanted: dict[tuple[str, Signature], Case] = {}
        for j in judged:
            for finding in j.result.findings():
                signature = signature_of(finding)
                for case in self.triage.rechecks_for(j.case, signature):
                    wanted.setdefault((case.digest(), signature), case)
        if len(wanted) < 2 or self.config.pack < 2:
            return
        clock, compiled = time.perf_counter(), self.session.recheck_compile_s
        try:
            items = [(case, key[1]) for key, case in wanted.items()]
            answers = self.session.still_fail(items, self.config.pack)
            self.rechecked.update(zip(wanted, answers, strict=True))
        finally:
            self._rechecked_for(time.perf_counter() - clock, compiled)

    def keep_launch(self, judged: Sequence[Judged]) -> None:
        """:meth:`keep` every case of one launch, their rechecks run together first."""
        self.recheck_ahead(judged)
        try:
            for j in judged:
                self.keep(j)
        finally:
            self.rechecked.clear()

    def keep(self, judged: Judged) -> None:
        """Triage, log and (for a new group) write every finding of one case."""
        failing = [r.path for r in judged.result.findings()]
        index = self.tally.cases
        for finding in judged.result.findings():
            member = Member(
                case=judged.case,
                result=finding,
                other_paths=tuple(p for p in failing if p != finding.path),
                index=index,
            )
            group = self.triage.assign(member, self.recheck)
            self._note(member, group)
            if group.repro is None:
                self.write_group(group)
        for finding in judged.packed_only:
            self._packed_only(judged, finding, index)

    def _note(self, member: Member, group: Group) -> None:
        gid = group.id
        self.out.log(
            LoggedFinding(
                index=member.index,
                case=member.case,
                result=member.result,
                group=gid,
                other_paths=member.other_paths,
            )
        )
        self.tally.findings.append(
            FindingRecord(
                path=member.result.path,
                kind=member.result.outcome,
                detail=member.result.detail,
                reason=member.result.reason,
                case_digest=member.case.digest(),
                group=gid,
                index=member.index,
            )
        )

    def _packed_only(self, judged: Judged, finding: PathResult, index: int) -> None:
        """A finding only the packed launch shows (a kernel that mixes up the requests of one
        launch): kept with the whole launch, unshrunk (the shrinker works on one case)."""
        launch_requests = sum(c.batch.num_requests for c in judged.launch)
        reason = (
            f"only in a launch of {len(judged.launch)} packed cases ({launch_requests} "
            f"requests): {finding.reason}"
        )
        finding = dataclasses.replace(finding, reason=reason)
        repro = self._repro(
            judged.case,
            CaseResult(case_digest=judged.case.digest(), results=(finding,)),
            finding,
            launch=judged.launch,
        )
        name = finding_stem(judged.case.digest(), finding.path, finding.outcome) + PACKED_ENDING
        file = write_repro(self.config.out_dir / "packed", repro, file_name=name)
        self.out.log(
            LoggedFinding(
                index=index,
                case=judged.case,
                result=finding,
                group="packed-only",
                launch=judged.launch,
            )
        )
        self.tally.findings.append(
            FindingRecord(
                path=finding.path,
                kind=finding.outcome,
                detail=finding.detail,
                reason=reason,
                case_digest=judged.case.digest(),
                group="packed-only",
                index=index,
                packed_only=True,
                repro=str(file),
                variant=variant_name(judged.case),
                requests=judged.case.batch.num_requests,
                launch_requests=launch_requests,
                likely_known=likely_known(judged.case, finding, judged.launch, self.triage.known),
            )
        )

    # -- repros -------------------------------------------------------------------------------

    def _repro(
        self,
        case: Case,
        result: CaseResult,
        finding: PathResult,
        *,
        shrink_report: ShrinkReport | None = None,
        launch: tuple[Case, ...] = (),
    ) -> Repro:
        return Repro(
            case=case,
            launch=launch,
            status="finding",
            paths=tuple(p.name for p in self.session.paths),
            finding=Finding(path=finding.path, kind=finding.outcome, reason=finding.reason),
            result=result,
            tolerance=self.session.settings.tolerance,
            environment=stamp(self.session.device),
            shrink=shrink_report,
            plugins=self.session.settings.plugins,
        )

    def write_group(
        self, group: Group, result: CaseResult | None = None, report: ShrinkReport | None = None
    ) -> None:
        """(Re)write ``group``'s representative repro: its minimal case once shrunk."""
        case = group.minimal or group.representative.case
        verdict = group.minimal_result or group.representative.result
        if result is None:
            result = CaseResult(case_digest=case.digest(), results=(verdict,))
        gid = group.id
        old = group.repro
        file = self.out.write_group(gid, self._repro(case, result, verdict, shrink_report=report))
        group.repro = str(file)
        if old and old != group.repro:
            Path(old).unlink(missing_ok=True)
        self.out.write_index(self.tally.cases, self.triage.records(self.tally.cases))
