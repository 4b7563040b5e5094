"""Reading run directories and drawing plots; never training code."""
