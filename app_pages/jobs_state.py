"""This session's conversion jobs and the machine-wide queue."""

from __future__ import annotations

import streamlit as st

from analyzer.convert.builds_folder import queue
from analyzer.convert.jobs import BuildJob, JobSnapshot
from analyzer.report.catalog import (
    builds_root,
)
from app_pages.session_keys import Key


def start_job(job: BuildJob) -> None:
    st.session_state.setdefault(Key.BUILDS_JOBS, []).append(job.start())


def job_snapshots() -> list[JobSnapshot]:
    return [j.snapshot() for j in st.session_state.get(Key.BUILDS_JOBS, [])]


def running_keys() -> set[str]:
    """Build keys converting now: this session's jobs and the machine-wide queue."""
    keys = {k for s in job_snapshots() if not s.finished for k in s.keys}
    return keys | {e.key for e in queue(builds_root())}
