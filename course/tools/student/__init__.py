"""The tools a student runs beside the lessons: hints, clocks, profilers and benchmarks."""
