// The sign-in page needs only the shared shortcuts.
import './lib.js';
