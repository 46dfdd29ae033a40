"""The course's command-line tools (python -m course ...), by who runs them.

cli.py is the entry point and its table of verbs (verbs.py builds the parser from it);
student/ holds what a student runs beside the lessons, instructor/ what grades a class,
author/ what the course's authors run to make its starters, records and figures.
"""
