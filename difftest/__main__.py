from difftest.interfaces.cli import console_main

console_main()
