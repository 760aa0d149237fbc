"""Task environments: SWE-bench-format tasks, their reward, and the SWE-smith-style builder."""
