"""The tools the course's authors run: starters, records, figures, bounds and measurements."""
