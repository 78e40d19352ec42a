/* Session 12 probe: AES-256-GCM seal cost per datagram size, best of 40 interleaved rounds.
 * gcc -O2 aead-sizes.c -o /tmp/aead-sizes -lcrypto && /tmp/aead-sizes 1344 1440 1448 1472 1536 8944 */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint8_t buf[65536], hdr[24], key[32], iv[12];
int main(int argc,char**argv){
  EVP_CIPHER_CTX *c=EVP_CIPHER_CTX_new(); int outl;
  EVP_EncryptInit_ex(c,EVP_aes_256_gcm(),NULL,NULL,NULL);
  EVP_CIPHER_CTX_ctrl(c,EVP_CTRL_AEAD_SET_IVLEN,12,NULL);
  EVP_EncryptInit_ex(c,NULL,NULL,key,NULL);
  double best[64]; for(int a=0;a<64;a++)best[a]=1e9;
  for(int r=0;r<40;r++) for(int a=1;a<argc;a++){ int SZ=atoi(argv[a]); int n=5000; double t=now();
    for(int i=0;i<n;i++){ iv[11]=i; EVP_EncryptInit_ex(c,NULL,NULL,NULL,iv); EVP_EncryptUpdate(c,NULL,&outl,hdr,24);
     EVP_EncryptUpdate(c,buf,&outl,buf,SZ); EVP_EncryptFinal_ex(c,buf+SZ,&outl); EVP_CIPHER_CTX_ctrl(c,EVP_CTRL_AEAD_GET_TAG,16,buf+SZ);}
    double e=(now()-t)/n*1e9; if(e<best[a])best[a]=e;}
  for(int a=1;a<argc;a++){int SZ=atoi(argv[a]); printf("%5d %6.0f ns %.3f CPU-s/GB\n",SZ,best[a],best[a]/SZ);}
}
