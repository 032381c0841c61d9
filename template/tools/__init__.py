"""Commands beside training (doctor, lr-find, export); the training core never imports them."""
