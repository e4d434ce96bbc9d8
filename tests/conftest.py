"""pytest set-up. Under CI (CI=true) hypothesis draws the same examples every run, so a submission is
judged on a fixed set; locally each run explores new examples."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
