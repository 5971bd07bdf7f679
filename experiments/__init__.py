"""The experiments that measure autoln, one folder per question (``common`` the pieces the
others build on, ``truth``, ``fidelity``, ``race``, ``stability``, ``papers``); the tables of
results they read and extend sit at this folder's top (README.md lists which script writes
which table). A package so that the scripts import each other as ``experiments.<folder>.<script>``;
each script still runs as ``python experiments/<folder>/<script>.py`` from the repository root.
"""
