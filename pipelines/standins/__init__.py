"""Tiny random-weight stand-ins for the image models, built from the real library classes.

Used by the tests and by the offline embedded default run: they are saved with each library's
own serialisation and loaded through the production loading code. Their outputs are meaningless;
every run that uses them says so in its console output, metrics.json and report.html.
"""
