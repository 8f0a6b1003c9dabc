"""`rollwire run`: a whole training run on one machine, from one recipe.

    recipe.py      the recipe (TOML) and what each component gets from it; demo.toml is bundled
    runner.py      the run itself: model, warm start, components, display, curve
    supervisor.py  child processes: start, restart on crash, stop in order
    roles.py       one component per process (`python -m rollwire.run.roles ROLE RECIPE_JSON`)
    progress.py    metrics, live display and reward curve, read back from the run's events
"""
