"""Session-state keys that more than one module reads or writes, in one place (a typo is an AttributeError, not a
silently empty value). Keys are prefixed by the page that owns them (``ab_``, ``builds_``, ``logs_``, ``bw_``); a
widget key that only its own page uses stays a literal beside its widget."""

from enum import StrEnum


class Key(StrEnum):
    AB_A = "ab_a"  # the A/B page's A (an analysis id); the Builds page's "Set as A" writes it, the URL keeps it
    AB_B = "ab_b"
    WEIGHT_CHARGE = "ab_weight_charge"  # how compressed weights count per token; every page's bytes use it
    BUILDS_PACKAGES = "builds_packages"  # .mlpackage / .aimodel paths this session analyses (the catalog lists them)
    BUILDS_PACKAGE_SHAPES = "builds_package_shapes"  # path → {input name: shape}: a flexible package's given shapes
    BUILDS_JOBS = "builds_jobs"  # this session's conversion jobs
    BUILDS_UPLOAD_KEPT = "builds_upload_kept"
    BUILDS_BENCH = "builds_bench"  # the Builds page's last bench (analyzer.measure.bench.BenchResult)
    LOGS_FILES = "logs_files"  # (name, bytes) of the device logs this session works on
    LOGS_UPLOADS = "logs_uploads"
    LOGS_PASTED = "logs_pasted"
    LOGS_BENCH = "logs_bench"  # (name, bytes) of the log CSVs the Builds page's bench runs wrote (qfold schema)
    LOGS_PLANS = "logs_plans"  # (name, bytes) of the placement plans read on the Device logs page (A/B Placement tab)
    LOGS_MAPPING = "logs_mapping"  # build label → analysis id
    LOGS_EXAMPLE = "logs_example"  # False once the write-up's example log is removed (shown beside the others)
    LOGS_TOKEN = "logs_token"  # this session's server-side log store (app_pages.logs_store), kept in the URL
    LOGS_DEVICE = "logs_device"  # the Device logs page's device and build labels for rows that name none
    LOGS_LABEL = "logs_label"
    BW_SETTING = "bw_setting"  # the one BandwidthSetting every page's predictions use
    URL_RESTORED = "url_restored"
    URL_ERRORS = "url_errors"
