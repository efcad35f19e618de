"""tests/speech needs the speech extra (installed by make test) and espeak-ng (make sysdeps):
without them these tests fail loudly rather than skip, as the rest of the suite does for its
own system packages."""
