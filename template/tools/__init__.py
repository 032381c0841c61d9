"""Commands beside training (doctor, lr-find, export, sweep, cv); the training core never imports them."""
