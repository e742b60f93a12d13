"""One module per view; each owns its layout and puts the data it is given on screen."""
