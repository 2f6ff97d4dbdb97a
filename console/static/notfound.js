// The not-found page needs only the shared shortcuts.
import './lib.js';
