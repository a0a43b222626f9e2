"""The project's tests. A regular package (not a namespace): torch-fidelity installs a top-level
``tests`` package into site-packages, which would otherwise shadow this one in Ray workers that
import test-module classes (tests/studies/amplification/test_resume.py)."""
